#!/usr/bin/env bash
# Session 17, call 6 (1 GPU, ~3 min): gate_up and down of one-token steps in one launch
# (moe_pair_mx4_mma: down part x of slot s starts once slot s's gate_up parts are counted, no
# kernel boundary between them; compile-time XSERV_EXP_FUSED_MOE of an experimental patch),
# old (6d3ca8a) against it: greedy tokens, the batch-1 rows twice, B8, the timeline at depth 0
# and 4096, the engine GPU tests on fused plans. Needs .device/bin/{xserv,engine_gpu_tests},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
export XSERV_EXP_FUSED_MOE=1
ab_round
grep -c moe_pair /tmp/p_new/plan.json
RUN_TIMEOUT=200 engine_tests
echo "done in $((SECONDS - start)) s"
