#!/usr/bin/env bash
# Session 14, call 8 (1 GPU, ~1 min; run as one command line, this file records it): the twelve
# codegen GPU test cases 14f did not reach (its first half stopped at run_tests' 300 s cap in
# the gemm_wg grouped MoE test). Needs .device/bin/codegen_gpu_tests, .device/data.
source "$(dirname "$0")/common.sh"
RUN_LOG=_rest run_tests codegen_gpu_tests -d -tc="linear kernels match*,tensor-core linear_decode*,the in-register MXFP4*,MoE decode kernels on MXFP4*,grouped MoE gemms on MXFP4*,argmax kernel*,rope_yarn*,qkv_*,kv_write*"
echo "done in $((SECONDS - start)) s"
