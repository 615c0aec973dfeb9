#!/usr/bin/env bash
# Session 11, call 7 (1 GPU, ~2 min): decode attention and the router, after the GEMVs (call 6),
# issue their first loads (cached keys and values; router weights) before griddepcontrol.wait.
# Old binary (.device/old/xserv: HEAD 24291f8) against new on the
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
run_tests codegen_gpu_tests -tc="*decode attention*,*router*,attention kernels*,*rms_norm*"
echo "done in $((SECONDS - start)) s"
