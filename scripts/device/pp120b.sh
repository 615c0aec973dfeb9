#!/usr/bin/env bash
# One call on nvidia-h200-x2 (about 8 minutes): the synthetic gpt-oss-120b (36 layers, 128
# experts, ~230 GB in BF16) with --pp 2 over the two GPUs against HF transformers BF16 spread over
# the same two GPUs (device_map="auto"): greedy tokens for 32 steps after a 64-token random
# prompt, each rank's memory, prefill and decode speed. Needs .device/bin/xserv (carry
# [".device/bin", ".device/data"]) and torch + transformers + accelerate on the machine. Logs
# land in $OUT.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$X synth --config examples/gpt-oss-120b/config.json -o /tmp/g120 --seed 0 2>&1 | tail -1
echo "== synth done at $((SECONDS - start)) s"
timeout 420 python3 tools/hf_20b_reference.py /tmp/g120 --ids-seed 0 --tokens 64 --greedy 32 \
  --out /tmp/ref120 --device-map auto --bf16-only > "$OUT/hf120.log" 2>&1
echo "HF rc=$? at $((SECONDS - start)) s"
grep -vE "warn|Warn|Loading|^\s*$" "$OUT/hf120.log" | tail -4
cp /tmp/ref120/meta.json "$OUT/hf120_meta.json" 2> /dev/null
ids=$(tr ' ' ',' < /tmp/ref120/ids.txt | tr -d '\n')
$X compile /tmp/g120 -o /tmp/p120 --pp 2 --max-seq 4096 --max-batch 8 2>&1 | tail -1
timeout 300 $X run /tmp/p120 --backend cuda --prompt-ids "$ids" --max-tokens 32 \
  > "$OUT/x120.txt" 2> "$OUT/x120.err"
echo "xserv pp2 rc=$? at $((SECONDS - start)) s"
grep -E "^\[run\]|\[cuda\] ready|ranks ready" "$OUT/x120.err"
python3 - "$OUT/x120.txt" /tmp/ref120/hf_bf16_greedy.json <<'PY'
import json, sys
xs = [int(t) for t in open(sys.argv[1]).read().strip().split(",") if t]
ref = json.load(open(sys.argv[2]))
hf, margin = ref["greedy"], ref["margin"]
shared = next((i for i, (a, b) in enumerate(zip(xs, hf)) if a != b), min(len(xs), len(hf)))
low = next((i for i, m in enumerate(margin) if m < 0.05), len(margin))
print(f"xserv pp2 vs HF BF16 (2 GPUs): {shared} of {len(hf)} greedy tokens shared; HF's own "
      f"top-2 margin first below 0.05 at step {low}")
PY
timeout 200 $X bench /tmp/p120 --backend cuda -p 512 -n 32 -b 1,8 -r 1 2> "$OUT/bench120.err" | tail -3
echo "== done at $((SECONDS - start)) s"
