#!/usr/bin/env bash
# One call on nvidia-h200-x4 (issue 6, about 6 minutes): the synthetic 20b with --pp 4 over four
# GPUs (one process each, NCCL) against --pp 1: greedy tokens and every step's logits for 64
# steps on 4 prompts, then prefill and batched-decode speed for pp 1, 2 and 4. With PP_LOCAL=1
# the --pp plans run every stage in one process on one GPU instead (the same-device transport).
# Needs .device/bin/xserv and .device/data/gpt-oss-20b.json (carry [".device/bin",
# ".device/data"]) and numpy. Logs land in $OUT.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
local_flag=""; [ "${PP_LOCAL:-0}" = 1 ] && local_flag="--pp-local"
$X synth --config $D/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
for pp in 1 2 4; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
done
prompts=("$(seq -s, 1000 37 2800)" "$(seq -s, 7 3 300)" "200002,1,2,3,4,5" "$(seq -s, 50000 911 60000)")
for pp in 1 4; do
  lf=""; [ "$pp" -gt 1 ] && lf=$local_flag
  for i in "${!prompts[@]}"; do
    timeout 150 $X run /tmp/pp$pp --backend cuda $lf --prompt-ids "${prompts[$i]}" --max-tokens 64 \
      --logits-out /tmp/logits_pp${pp}_p$i.f32 > "$OUT/pp${pp}_p$i.txt" 2> "$OUT/pp${pp}_p$i.err"
    echo "pp$pp prompt $i rc=$? $(grep -E '^\[run\]' "$OUT/pp${pp}_p$i.err" | tail -1)"
  done
done
grep -h "pipeline\]" "$OUT/pp4_p0.err" | head -2
python3 - "$OUT" <<'PY'
import sys
import numpy as np
out = sys.argv[1]
for i in range(4):
    same_tokens = open(f"{out}/pp1_p{i}.txt").read() == open(f"{out}/pp4_p{i}.txt").read()
    a = np.fromfile(f"/tmp/logits_pp1_p{i}.f32", "<f4").reshape(-1, 201088)
    b = np.fromfile(f"/tmp/logits_pp4_p{i}.f32", "<f4").reshape(-1, 201088)
    rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
    same = int((a == b).all(axis=1).sum())
    print(f"pp4 prompt {i}: tokens {'equal' if same_tokens else 'DIFFER'}; logits rel L2 max "
          f"{rel.max():.3g} (prefill row {rel[0]:.3g}), rows bitwise equal {same} of {len(a)}")
PY
for pp in 1 2 4; do
  lf=""; [ "$pp" -gt 1 ] && lf=$local_flag
  echo "== bench pp$pp"
  timeout 150 $X bench /tmp/pp$pp --backend cuda $lf -p 512,2048 -n 32 -b 1,32 -r 2 \
    2> "$OUT/bench_pp$pp.err" | grep -E "^\| gpt"
done
echo "== done at $((SECONDS - start)) s"
