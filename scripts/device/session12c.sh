#!/usr/bin/env bash
# Session 12, call 3 (1 GPU, ~5 min): the shared-tile tensor-core MoE decode kernels as the
# lowering's default (ldmatrix fragments, branch-free block scales with an exact fallback,
# nibble pairs in 3 instructions): the MXFP4 GPU tests (decode of every scale and code, the
# decode kernels, gemm_wg's fragments), kernels_bench's tilings, then old (.device/old/xserv)
# against new on the 20b: decode rows, greedy tokens, engine GPU tests. Needs .device/bin/{xserv,
# codegen_gpu_tests,engine_gpu_tests,kernels_bench}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*MXFP4*,*tensor-core MoE*,*gemm_wg*,*moe kernels*"
grep -E "hidden 2880, scales 117" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-250
echo "== bench at $((SECONDS - start)) s"
kb_moe
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_decode 2
ab_tokens 64
echo "== tests at $((SECONDS - start)) s"
engine_tests
echo "done in $((SECONDS - start)) s"
