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
timeout 200 python3 tools/hf_20b_reference.py /tmp/g20 --ids-seed 0 --tokens 256 --greedy 64 \
  --out /tmp/ref > "$OUT/hf_ref.log" 2>&1
echo "HF reference rc=$? at $((SECONDS - start)) s"
XSERV_20B_CKPT=/tmp/g20 XSERV_20B_REF=/tmp/ref timeout 150 $B/cli_gpu_tests \
  -tc="gpu: synthetic 20b*" > "$OUT/hf20b_test.log" 2>&1
echo "hf20b test rc=$?: $(grep -E '^\[doctest\] test cases' "$OUT/hf20b_test.log" | tail -1)"
grep -E "MESSAGE|ERROR" -A1 "$OUT/hf20b_test.log" | grep -vE "^--$" | cut -c1-220 | head -16
echo "done in $((SECONDS - start)) s"
