#!/usr/bin/env bash
# Session 17, call 8 (1 GPU, ~3 min): pp 2 against pp 1 with the code as it lands (MXFP4 experts,
# plain bf16 gemms, the tensor-core decode kernels: issue 17's "pp 2 still equals pp 1"), both
# stages in one process on one GPU (--pp-local, the same-device transport: every stage runs the
# kernels pp 1 runs on its rows), as pp4.sh does: greedy tokens and every step's logits for 64
# steps on 4 prompts, with default prompt micro-batches and with one, then greedy picks on the
# GPU. Two GPUs over NCCL need nvidia-h200-x2. Needs .device/bin/xserv, .device/data, numpy.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/pp1 --max-seq 4096 --max-batch 32 2>&1 | tail -1 &
$X compile /tmp/g20 -o /tmp/pp2 --max-seq 4096 --max-batch 32 --pp 2 2>&1 | tail -1 &
wait
L=/tmp/pplogs
mkdir -p $L
for tag in pp1 pp2 pp2mb1; do
  plan=/tmp/${tag:0:3}
  flags=""; [ "$tag" != pp1 ] && flags="--pp-local"
  for i in "${!PROMPTS[@]}"; do
    env $([ "$tag" = pp2mb1 ] && echo XSERV_PIPELINE_MICROBATCHES=1) timeout 150 $X run $plan \
      --backend cuda $flags --prompt-ids "${PROMPTS[$i]}" --max-tokens 64 \
      --logits-out /tmp/logits_${tag}_p$i.f32 > $L/${tag}_p$i.txt 2> $L/${tag}_p$i.err
    echo "$tag prompt $i rc=$? $(grep -E '^\[run\]' $L/${tag}_p$i.err | tail -1)"
  done
done
for tag in pp2 pp2mb1; do
  for i in "${!PROMPTS[@]}"; do
    cmp -s $L/pp1_p$i.txt $L/${tag}_p$i.txt && echo "$tag prompt $i: pp1's 64 tokens" \
      || echo "$tag prompt $i: tokens DIFFER from pp1"
  done
  python3 scripts/device/compare_logits.py /tmp pp1 $tag 4
done
for i in "${!PROMPTS[@]}"; do # greedy picks on the GPU (no logits to the host)
  timeout 150 $X run /tmp/pp2 --backend cuda --pp-local --prompt-ids "${PROMPTS[$i]}" \
    --max-tokens 64 > $L/pp2g_p$i.txt 2> $L/pp2g_p$i.err
  cmp -s $L/pp1_p$i.txt $L/pp2g_p$i.txt && echo "pp2 prompt $i, picks on the GPU: pp1's" \
    || echo "pp2 prompt $i, picks on the GPU: DIFFER from pp1 ($(tail -1 $L/pp2g_p$i.err))"
done
echo "done in $((SECONDS - start)) s"
