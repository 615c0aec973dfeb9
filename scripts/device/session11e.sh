#!/usr/bin/env bash
# Session 11, call 5 (1 GPU, ~2 min): the tensor-core MXFP4 moe_down_part prototype
# (moe_down_part_mx4_mma: mma.sync m16n8k16 on raw nibble pairs, raw or normalised operands)
# against the FMA kernel and ir::ref, then kernels_bench's one-token timing of the three.
# Needs .device/bin/{codegen_gpu_tests,kernels_bench}.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*tensor-core moe_down_part*"
grep -E "against ir::ref: FMA" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //'
timeout 120 $B/kernels_bench -tc="MXFP4 moe_down_part*" > /tmp/kb.log 2>&1
echo "kernels_bench rc=$?"; grep -E "mxfp4 down_part" /tmp/kb.log | sed 's/.*MESSAGE: //'
tail -5 /tmp/kb.log | grep -E "ERROR|error" || true
echo "done in $((SECONDS - start)) s"
