#!/usr/bin/env bash
# Session 17, call 9 (1 GPU, ~1 min): the 120b's shapes against HF transformers on one GPU: a
# synthetic checkpoint of gpt-oss-120b's config cut to its first 4 layers (128 experts, the
# 120b's router and MoE widths; the config made here from examples/gpt-oss-120b/config.json),
# 96 random ids and 32 greedy steps through tools/hf_20b_reference.py (HF BF16 and fp32), then
# cli_gpu_tests' HF case on it. The full 36
# layers against HF BF16 (234 GB for HF) need nvidia-h200-x2. Needs .device/bin/{xserv,
# cli_gpu_tests}.
source "$(dirname "$0")/common.sh"
python3 - <<'PY'
import json
c = json.load(open("examples/gpt-oss-120b/config.json"))
c["num_hidden_layers"] = 4
c["layer_types"] = c["layer_types"][:4]
json.dump(c, open("/tmp/g120s.json", "w"), indent=1)
PY
$X synth --config /tmp/g120s.json -o /tmp/g120s --seed 0 2>&1 | tail -1
timeout 170 python3 tools/hf_20b_reference.py /tmp/g120s --ids-seed 0 --tokens 96 --greedy 32 \
  --out /tmp/ref120s > "$OUT/hf_ref.log" 2>&1
echo "HF reference rc=$? at $((SECONDS - start)) s"
tail -3 "$OUT/hf_ref.log" | cut -c1-200
XSERV_20B_CKPT=/tmp/g120s XSERV_20B_REF=/tmp/ref120s timeout 90 $B/cli_gpu_tests \
  -tc="gpu: synthetic 20b*" > "$OUT/hf_test.log" 2>&1
echo "HF test rc=$?: $(grep -E '^\[doctest\] test cases' "$OUT/hf_test.log" | tail -1)"
grep -E "MESSAGE|ERROR" -A1 "$OUT/hf_test.log" | grep -vE "^--$" | cut -c1-220 | head -16
echo "done in $((SECONDS - start)) s"
