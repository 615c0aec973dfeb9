#!/usr/bin/env bash
# One device call: the full-size synthetic gpt-oss-20b through xserv's CUDA engine against HF
# transformers (BF16 and fp32), for a 256-token random prompt and 64 greedy tokens. Build here
# and copy into .device/: bin/{xserv,cli_gpu_tests}, data/gpt-oss-20b.json; call the device tool
# with carry [".device/bin", ".device/data"]. Logs land in $OUT. About 5 minutes.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
synth20b
echo "== synth done at $((SECONDS - start)) s"
timeout 200 python3 tools/hf_20b_reference.py /tmp/g20 --ids-seed 0 --tokens 256 --greedy 64 \
  --out /tmp/ref > "$OUT/hf_ref.log" 2>&1
ref_rc=$?
grep -vE "warn|Warn|^\s*$" "$OUT/hf_ref.log" | tail -8
cp /tmp/ref/meta.json /tmp/ref/*greedy.json /tmp/ref/ids.txt "$OUT/" 2> /dev/null
echo "== HF reference rc=$ref_rc at $((SECONDS - start)) s"
XSERV_20B_CKPT=/tmp/g20 XSERV_20B_REF=/tmp/ref timeout 150 $B/cli_gpu_tests \
  -tc="gpu: synthetic 20b*" > "$OUT/hf20b_test.log" 2>&1
test_rc=$?
grep -E "MESSAGE|ERROR|CHECK|positions over|greedy step" -A1 "$OUT/hf20b_test.log" |
  grep -vE "^--$" | head -30
echo "== total $((SECONDS - start)) s"
echo "hf reference rc=$ref_rc; test rc=$test_rc: $(grep -E '^\[doctest\] test cases' \
  "$OUT/hf20b_test.log" | tail -1)"
