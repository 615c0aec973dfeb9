#!/usr/bin/env bash
# Session 13, call 1 (1 GPU, ~5 min): where a batch-1 decode token goes inside the CUDA graph,
# and lm_head of 2-8 token steps on tensor cores. Old (.device/old/xserv: commit 7d80bee)
# against new on the 20b: greedy tokens, batch 8 and 2, batch 1; kernels_bench's lm_head sweep;
# then each per-layer kernel launched twice in the graph (XSERV_PROFILE_REPEAT) at depth 0 and
# 4096: the step's growth is that kernel's in-graph cost. Needs .device/bin/{xserv,
# kernels_bench}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
ab_tokens 64
ab_batch 8
ab_batch 2
ab_decode 1
echo "== kernels_bench at $((SECONDS - start)) s"
timeout 150 $B/kernels_bench -tc="lm_head decode GEMV*" > "$OUT/kb_lm.log" 2>&1
echo "kernels_bench rc=$?"
grep -E "lm_head |ERROR" "$OUT/kb_lm.log" | sed 's/.*MESSAGE: //'
echo "== repeats at $((SECONDS - start)) s"
repeats 0,4096 none qkv_rope_decode attention_decode linear_residual rmsnorm_router_topk \
  moe_gate_up moe_down_part moe_combine_residual
echo "done in $((SECONDS - start)) s"
