#!/usr/bin/env bash
# Session 12, call 8 (1 GPU, ~3 min): o_proj of decode steps of 2 to 8 tokens on tensor cores
# (one token keeps the FMA kernel), each chunk's MMAs summed from zero: the GPU tests, then old
# (.device/old/xserv: commit 2c5a886) against new on the 20b: batch-1 decode rows, batch 8,
# greedy tokens; the engine GPU tests. Needs .device/bin/{xserv,codegen_gpu_tests,
# engine_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*tensor-core linear_decode*,*tensor-core MoE*"
grep -E "linear_decode_mma k (4096|2880)" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-220
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_decode 2
ab_batch 8
ab_tokens 64
echo "== tests at $((SECONDS - start)) s"
engine_tests
echo "done in $((SECONDS - start)) s"
