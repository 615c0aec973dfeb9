#!/usr/bin/env bash
# Session 12, call 5 (1 GPU, ~4 min): the tensor-core MoE decode kernels with a 4-chunk
# cp.async ring (dynamic shared memory) as the lowering's default: the MXFP4 GPU tests,
# kernels_bench's ring depths and tilings, old (.device/old/xserv) against new on the 20b
# (decode rows, greedy tokens), the engine GPU tests and the HF batch fixtures.
# Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests,cli_gpu_tests,kernels_bench},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*in-register MXFP4 decode*,*MoE decode kernels on MXFP4*,*tensor-core MoE*,*fragment decode of gemm_wg*,*grouped MoE gemms on MXFP4*"
grep -E "hidden 2880, scales 117" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-250
echo "== bench at $((SECONDS - start)) s"
kb_moe
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_decode 1
ab_tokens 64
echo "== tests at $((SECONDS - start)) s"
engine_tests
hf_batch_fixtures
echo "done in $((SECONDS - start)) s"
