#!/usr/bin/env bash
# Session 8, first call (1 GPU, ~5 min): the GPU checks left from session 7 (argmax marking
# non-finite rows, both MXFP4 decode-kernel formats), the warpgroup-MMA gemm against ir::ref,
# its throughput against the mma.sync gemm at the 20b's shapes, and where a prompt step's time
# goes today (XSERV_PROFILE=1, bf16 and mxfp4 plans). Needs .device/bin (xserv, codegen_gpu_tests,
# kernels_bench) and .device/data/gpt-oss-20b.json.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
run_tests codegen_gpu_tests -tc="*argmax*,*MXFP4*,*gemm_wg*"
grep -E "rel L2" "$OUT/codegen_gpu_tests.log" | grep -i "gemmwg" | head -40
echo "== gemm throughput ($((SECONDS - start)) s)"
timeout 400 $B/kernels_bench -tc="gemm throughput*" > "$OUT/bench.log" 2>&1
echo "kernels_bench rc=$?"
grep -E "MESSAGE|gemm " "$OUT/bench.log" | grep -v "^.*MESSAGE: *$" | sed 's/.*MESSAGE: //' | grep gemm
echo "== profile ($((SECONDS - start)) s)"
synth20b
for f in bf16 mxfp4; do
  $X compile /tmp/g20 -o /tmp/p_$f --max-seq 8192 --max-batch 64 --expert-format $f > /dev/null 2>&1
  XSERV_PROFILE=1 $X bench /tmp/p_$f --backend cuda -p 512,2048 -n 16 -b 1,64 -r 1 > "$OUT/profile_$f.log" 2>&1
  echo "-- $f"; grep -E "^\||profile|ms" "$OUT/profile_$f.log" | head -60
done
echo "done in $((SECONDS - start)) s"
