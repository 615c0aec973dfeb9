#!/usr/bin/env bash
# Session 12, call 7 (1 GPU, ~4 min): o_proj of decode steps on tensor cores (linear_decode_mma:
# the tokens as the MMA's columns, the weights through cp.async rings) and the MoE scale factor
# as one PTX mad: their GPU tests, kernels_bench's o_proj tilings, old (.device/old/xserv: commit
# 2c5a886) against new on the 20b, the engine GPU tests and the HF batch fixtures.
# Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests,cli_gpu_tests,kernels_bench},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*tensor-core linear_decode*,*tensor-core MoE*"
grep -E "linear_decode_mma|hidden 2880, scales 117..130, tiling 0/0/0 stages 2" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-220
echo "== bench at $((SECONDS - start)) s"
timeout 150 $B/kernels_bench -tc="o_proj decode GEMV*" > "$OUT/kb.log" 2>&1
echo "kernels_bench rc=$?"; grep -E "o_proj |ERROR" "$OUT/kb.log" | sed 's/.*MESSAGE: //'
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_decode 2
ab_tokens 64
echo "== tests at $((SECONDS - start)) s"
engine_tests
hf_batch_fixtures
echo "done in $((SECONDS - start)) s"
