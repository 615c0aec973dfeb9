#!/usr/bin/env bash
# Session 13, call 2 (1 GPU, ~4 min): the decode kernels load their epilogue's small weights
# (biases, sinks, norm gains to L2, qkv's RoPE angles) before the dependency wait, and lm_head
# runs on tensor cores at one token too. The GPU tests of the kernels that changed, then old
# (.device/old/xserv: commit 7d80bee) against new on the 20b: batch-1 decode (two rounds), batch
# 8, greedy tokens, and the in-graph cost of each per-layer kernel (XSERV_PROFILE_REPEAT) at
# depth 0. Needs .device/bin/{xserv,codegen_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="linear kernels match*,tensor-core linear_decode*,attention kernels match*,decode attention with ROUND16*,tensor-core MoE decode*,qkv_rope_decode*,qkv_decode matches*,norm_router_topk*"
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_tokens 64
ab_decode 2
ab_batch 8
echo "== repeats at $((SECONDS - start)) s"
repeats 0 none qkv_rope_decode attention_decode linear_residual rmsnorm_router_topk \
  moe_gate_up moe_down_part
echo "done in $((SECONDS - start)) s"
