#!/usr/bin/env bash
# Session 14, call 1 (1 GPU, ~7 min): the MXFP4 MoE tensor-core kernels make each warp's scale
# factors once (shared memory) instead of loading scale bytes every chunk, and the router stores
# its logits straight into block 0 (one cluster barrier, not two). The GPU tests of the kernels
# that changed, then old (.device/old/xserv: commit e85ce67) against new on the 20b: greedy
# tokens, batch-1 decode twice, batch 8, the in-graph cost of the changed kernels, and
# kernels_bench's MoE sweep. Needs .device/bin/{xserv,codegen_gpu_tests,kernels_bench},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="tensor-core MoE decode*,norm_router_topk*,*rms_norm*,router_topk*"
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_tokens 64
ab_decode 2
ab_batch 8
echo "== repeats at $((SECONDS - start)) s"
repeats 0 none rmsnorm_router_topk moe_gate_up moe_down_part
echo "== kernels_bench at $((SECONDS - start)) s"
kb_moe
echo "done in $((SECONDS - start)) s"
