#!/usr/bin/env bash
# Session 12, call 9 (1 GPU, ~1.5 min): the review's WarpRowRing (the cp.async ring and
# ldmatrix shared by the tensor-core MoE and o_proj kernels; same SASS size): their GPU tests,
# old (.device/old/xserv: commit 2c5a886) against new on the 20b: decode rows once, B8, greedy
# tokens. Needs .device/bin/{xserv,codegen_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*tensor-core linear_decode*,*tensor-core MoE*"
synth20b
ab_compile
ab_decode 1
ab_batch 8
ab_tokens 64
echo "done in $((SECONDS - start)) s"
