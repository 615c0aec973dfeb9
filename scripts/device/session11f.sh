#!/usr/bin/env bash
# Session 11, call 6 (1 GPU, ~5 min): the decode GEMVs (qkv, o_proj, lm_head, the MoE down rows)
# issue their first weight loads before griddepcontrol.wait, so that they fly while the previous
# kernel finishes (down reads its expert ids from L2 before the wait: the router, two launches
# back, has completed by then). Old binary (.device/old/xserv: HEAD 4632740) against new on the
# 20b: decode rows at depth 0 and 4096, B64, pp512, greedy tokens; the engine GPU tests and the
# decode kernel tests. Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
ab_decode 2
ab_prompt_b64
ab_tokens 64
echo "== tests at $((SECONDS - start)) s"
engine_tests
run_tests codegen_gpu_tests -tc="*qkv*,*rope*,*linear*,*MoE decode*,*moe_down_part*,*decode GEMV*"
echo "done in $((SECONDS - start)) s"
