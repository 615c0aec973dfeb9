#!/usr/bin/env bash
# Which pipeline logits are bitwise equal to pp 1's (nvidia-h200-x2, about 1 minute after x2.sh's
# synth): the synthetic 20b with --pp 2 over two GPUs and prompt steps NOT split into micro-batches
# (XSERV_PIPELINE_MICROBATCHES=1), so every stage runs pp 1's kernels on pp 1's shapes; then
# --pp 4 through the same-device transport on one GPU (never split). Expected: every row of both
# bitwise equal to pp 1's. With REUSE_PP1=1 (x2.sh, which has just made them with this binary)
# it takes /tmp/g20, the plans and pp 1's logits as they are; otherwise it makes everything anew,
# so a machine kept warm between calls never mixes two builds' results.
# Needs .device/bin/xserv and .device/data/gpt-oss-20b.json. Logs land in $OUT.
source "$(dirname "$0")/common.sh"
reuse=${REUSE_PP1:-0}
rm -f /tmp/logits_pp2w_p*.f32 /tmp/logits_pp4l_p*.f32
[ "$reuse" = 1 ] || rm -f /tmp/logits_pp1_p*.f32
if [ "$reuse" = 1 ]; then synth20b --reuse; else synth20b; fi
for pp in 1 2 4; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  [ "$reuse" = 1 ] && [ "$pp" -lt 4 ] && [ -f /tmp/pp$pp/plan.json ] ||
    $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
done
prompts=("${PROMPTS[@]}")
for name in pp1 pp2w pp4l; do
  case $name in
    pp1) plan=/tmp/pp1 flags="" ;;
    pp2w) plan=/tmp/pp2 flags="" ;;
    pp4l) plan=/tmp/pp4 flags="--pp-local" ;;
  esac
  for i in "${!prompts[@]}"; do
    [ -f /tmp/logits_${name}_p$i.f32 ] && continue # pp 1's from x2.sh (REUSE_PP1=1)
    XSERV_PIPELINE_MICROBATCHES=1 timeout 150 $X run $plan --backend cuda $flags \
      --prompt-ids "${prompts[$i]}" --max-tokens 64 --logits-out /tmp/logits_${name}_p$i.f32 \
      > "$OUT/${name}_p$i.txt" 2> "$OUT/${name}_p$i.err" ||
      echo "$name prompt $i failed (rc $?): $(tail -1 "$OUT/${name}_p$i.err")"
  done
done
python3 scripts/device/compare_logits.py /tmp pp1 pp2w 4
python3 scripts/device/compare_logits.py /tmp pp1 pp4l 4
echo "== pp_exact done at $((SECONDS - start)) s"
