#!/usr/bin/env bash
# The next session's first call (1 GPU, ~7 min): the one GPU test case session 14 did not finish.
# 14f's first half of codegen_gpu_tests ran into run_tests' 300 s cap in the gemm_wg grouped MoE
# test (its last case, T=150 on the 20b's shapes, every assertion so far passing); 14h ran the
# twelve test cases after it (all passed). The gemm_wg kernels did not change in session 14.
# Give that test a call of its own with a longer cap. Needs .device/bin/codegen_gpu_tests,
# .device/data.
source "$(dirname "$0")/common.sh"
RUN_TIMEOUT=540 RUN_LOG=_gemm_wg run_tests codegen_gpu_tests -tc="gemm_wg grouped MoE*"
echo "done in $((SECONDS - start)) s"
