#!/usr/bin/env bash
# One call on nvidia-h200-x2 (about 6 minutes): the synthetic gpt-oss-120b (36 layers, 128
# experts, ~230 GB in BF16) with --pp 2 over the two GPUs: each rank's memory, prefill and decode
# speed, greedy tokens for 32 steps after a 64-token random prompt; then HF transformers BF16
# spread over the same two GPUs (device_map="auto") on the same prompt, and the number of greedy
# tokens the two share. xserv runs first, so its numbers come back even if HF's load runs long.
# Needs .device/bin/xserv (carry [".device/bin", ".device/data"]) and torch + transformers +
# accelerate on the machine. Logs land in $OUT.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$X synth --config examples/gpt-oss-120b/config.json -o /tmp/g120 --seed 0 2>&1 | tail -1
echo "== synth done at $((SECONDS - start)) s"
# The prompt tools/hf_20b_reference.py draws for --ids-seed 0 --tokens 64 (the 120b's vocabulary).
ids=$(python3 -c 'import sys; sys.path.insert(0, "tools"); from hf_20b_reference import draw_ids
print(",".join(str(int(i)) for i in draw_ids(0, 64, 201088)[0]))')
$X compile /tmp/g120 -o /tmp/p120 --pp 2 --max-seq 4096 --max-batch 8 2>&1 | tail -1
timeout 240 $X run /tmp/p120 --backend cuda --prompt-ids "$ids" --max-tokens 32 \
  > "$OUT/x120.txt" 2> "$OUT/x120.err"
echo "xserv pp2 rc=$? at $((SECONDS - start)) s"
grep -E "^\[run\]|\[cuda\] ready|\[load\] done|ranks ready" "$OUT/x120.err"
timeout 150 $X bench /tmp/p120 --backend cuda -p 512 -n 32 -b 1,8 -r 1 2> "$OUT/bench120.err" |
  grep -E "^\| gpt"
echo "== xserv done at $((SECONDS - start)) s"
timeout $((560 - (SECONDS - start))) python3 tools/hf_20b_reference.py /tmp/g120 --ids-seed 0 \
  --tokens 64 --greedy 32 --out /tmp/ref120 --device-map auto --bf16-only > "$OUT/hf120.log" 2>&1
echo "HF rc=$? at $((SECONDS - start)) s"
grep -vE "warn|Warn|Loading|^\s*$" "$OUT/hf120.log" | tail -4
cp /tmp/ref120/meta.json "$OUT/hf120_meta.json" 2> /dev/null
python3 - "$OUT/x120.txt" /tmp/ref120/hf_bf16_greedy.json "$ids" /tmp/ref120/ids.txt <<'PY'
import json, sys
xs = [int(t) for t in open(sys.argv[1]).read().strip().split(",") if t]
ref = json.load(open(sys.argv[2]))
same_prompt = sys.argv[3].split(",") == open(sys.argv[4]).read().split()
hf, margin = ref["greedy"], ref["margin"]
shared = next((i for i, (a, b) in enumerate(zip(xs, hf)) if a != b), min(len(xs), len(hf)))
low = next((i for i, m in enumerate(margin) if m < 0.05), len(margin))
print(f"same prompt: {same_prompt}; xserv pp2 vs HF BF16 (2 GPUs): {shared} of {len(hf)} greedy "
      f"tokens shared; HF's own top-2 margin first below 0.05 at step {low}")
PY
echo "== done at $((SECONDS - start)) s"
