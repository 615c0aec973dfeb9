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
synth20b
for pp in 1 2 4; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
done
prompts=("${PROMPTS[@]}")
for pp in 1 4; do
  lf=""; [ "$pp" -gt 1 ] && lf=$local_flag
  for i in "${!prompts[@]}"; do
    timeout 150 $X run /tmp/pp$pp --backend cuda $lf --prompt-ids "${prompts[$i]}" --max-tokens 64 \
      --logits-out /tmp/logits_pp${pp}_p$i.f32 > "$OUT/pp${pp}_p$i.txt" 2> "$OUT/pp${pp}_p$i.err"
    echo "pp$pp prompt $i rc=$? $(grep -E '^\[run\]' "$OUT/pp${pp}_p$i.err" | tail -1)"
  done
done
grep -h "pipeline\]" "$OUT/pp4_p0.err" | head -2
for i in "${!prompts[@]}"; do
  cmp -s "$OUT/pp1_p$i.txt" "$OUT/pp4_p$i.txt" && echo "pp4 prompt $i: pp1's 64 tokens" \
    || echo "pp4 prompt $i: tokens DIFFER from pp1"
done
python3 scripts/device/compare_logits.py /tmp pp1 pp4 4
for i in "${!prompts[@]}"; do # greedy picks on the GPU (no logits to the host)
  timeout 150 $X run /tmp/pp4 --backend cuda $local_flag --prompt-ids "${prompts[$i]}" \
    --max-tokens 64 > "$OUT/pp4g_p$i.txt" 2> "$OUT/pp4g_p$i.err"
  rc=$?
  cmp -s "$OUT/pp1_p$i.txt" "$OUT/pp4g_p$i.txt" && echo "pp4 prompt $i, picks on the GPU: pp1's" \
    || echo "pp4 prompt $i, picks on the GPU: DIFFER from pp1 (rc $rc: $(tail -1 "$OUT/pp4g_p$i.err"))"
done
for pp in 1 2 4; do
  lf=""; [ "$pp" -gt 1 ] && lf=$local_flag
  echo "== bench pp$pp"
  timeout 150 $X bench /tmp/pp$pp --backend cuda $lf -p 512,2048 -n 32 -b 1,32 -r 2 \
    2> "$OUT/bench_pp$pp.err" | grep -E "^\| gpt"
done
echo "== done at $((SECONDS - start)) s"
