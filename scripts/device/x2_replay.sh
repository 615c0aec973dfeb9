#!/usr/bin/env bash
# Issue 15's last check, for nvidia-h200-x2 (~4 min): pp 2 over NCCL (two processes, one GPU
# each) replaying plan tables with every .ir deleted, against pp 1. First session9d.sh (tiny
# plans, bf16 and mxfp4 experts; on two GPUs its two-process runs take NCCL), then the synthetic
# 20b: greedy tokens of the 4 prompts (PROMPTS in common.sh), pp 2 over NCCL and over
# --pp-local against pp 1, the transport as the ranks log it. Needs .device/bin/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name --format=csv,noheader
bash scripts/device/session9d.sh
synth20b
$X compile /tmp/g20 -o /tmp/pp1 --max-seq 4096 --max-batch 8 > /tmp/c1.log 2>&1 &
$X compile /tmp/g20 -o /tmp/pp2 --max-seq 4096 --max-batch 8 --pp 2 > /tmp/c2.log 2>&1 &
wait
rm -f /tmp/pp1/*.ir /tmp/pp2/*.ir
ls /tmp/pp2 | tr '\n' ' '; echo
for i in 0 1 2 3; do
  timeout 120 $X run /tmp/pp1 --backend cuda --prompt-ids "${PROMPTS[$i]}" --max-tokens 32 \
    > /tmp/pp1_$i.txt 2> /dev/null
  XSERV_PIPELINE_TRANSPORT=nccl timeout 120 $X run /tmp/pp2 --backend cuda \
    --prompt-ids "${PROMPTS[$i]}" --max-tokens 32 > /tmp/pp2_$i.txt 2> /tmp/pp2_$i.err
  timeout 120 $X run /tmp/pp2 --backend cuda --pp-local --prompt-ids "${PROMPTS[$i]}" \
    --max-tokens 32 > /tmp/pl_$i.txt 2> /dev/null
  for v in pp2 pl; do
    cmp -s /tmp/pp1_$i.txt /tmp/${v}_$i.txt && echo "prompt $i: $v == pp1" ||
      echo "prompt $i: $v DIFFERS from pp1"
  done
done
grep -hi "nccl\|transport\|rank" /tmp/pp2_0.err | head -6
echo "done in $((SECONDS - start)) s"
