#!/usr/bin/env bash
# Session 8 (1 GPU, ~2 min): the warpgroup-MMA gemm's GPU tests and its throughput against the
# mma.sync gemm at the 20b's shapes (kernels_bench). Needs .device/bin (codegen_gpu_tests,
# kernels_bench). TESTS: doctest filter of codegen_gpu_tests.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="${TESTS:-*gemm_wg*}"
grep -E "rel L2" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | sort | awk '{print}' | head -60
echo "== gemm throughput ($((SECONDS - start)) s)"
timeout 400 $B/kernels_bench -tc="gemm throughput*" > "$OUT/bench.log" 2>&1
echo "kernels_bench rc=$?"
grep -E "ERROR" -A3 "$OUT/bench.log" | head
grep -E "MESSAGE: gemm" "$OUT/bench.log" | sed 's/.*MESSAGE: gemm //'
echo "done in $((SECONDS - start)) s"
