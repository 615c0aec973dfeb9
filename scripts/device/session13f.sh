#!/usr/bin/env bash
# Session 13, call 6 (1 GPU, ~6 min): the session's last measurement. Old (.device/old/xserv:
# commit 7d80bee) against new on the 20b: decode rows twice, batch 8, pp512 and B64, greedy
# tokens; then the 20b against HF transformers (hf20b.sh's steps). Needs .device/bin/{xserv,
# cli_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
ab_decode 2
ab_batch 8
ab_prompt_b64
ab_tokens 64
echo "== HF at $((SECONDS - start)) s"
hf_fidelity
echo "done in $((SECONDS - start)) s"
