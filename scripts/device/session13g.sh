#!/usr/bin/env bash
# Session 13, call 7 (1 GPU, ~3 min; what 13e's timeout left of the device time): the GPU tests
# of the last two kernel changes (the router's gains in registers before the wait, decode
# attention's step key asked of L1), the engine GPU tests (tiny model), then old
# (.device/old/xserv: commit 7d80bee) against new on the 20b: decode rows, batch 8, greedy tokens.
# Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="norm_router_topk*,attention kernels match*,decode attention with ROUND16*,qkv_rope_decode*"
timeout 90 $B/engine_gpu_tests > "$OUT/engine_gpu_tests.log" 2>&1
echo "engine_gpu_tests rc=$?: $(grep -E '^\[doctest\] (test cases|assertions)' \
  "$OUT/engine_gpu_tests.log" | tr '\n' ' ')"
grep -E "batch invariance \(" "$OUT/engine_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-160
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_decode 1
ab_batch 8
ab_tokens 64
echo "done in $((SECONDS - start)) s"
