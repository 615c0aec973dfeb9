#!/usr/bin/env bash
# Session 17, call 3 (1 GPU, ~5 min): why moe_combine grew from 3.4 to 8.6 us when qkv's blocks
# stream their rows into shared memory during it (17b), with compile-time knobs of an
# experimental patch (not kept): XSERV_EXP_QKV_PAD (qkv's block fills an SM's shared memory, so
# no moe_combine block shares its SM), XSERV_EXP_COMBINE_BLOCKS=3 (moe_combine in 3 blocks of
# 960 threads, leaving 129 SMs to qkv's 128 blocks), XSERV_EXP_COMBINE_LATE (moe_combine lets
# its dependents start only after its loads have landed). Batch-1 rows of each plan, old
# (6d3ca8a) first and last; timelines of two. Needs .device/bin/xserv, .device/old/xserv.
source "$(dirname "$0")/common.sh"
synth20b
declare -A KNOBS=([base]="" [pad]="XSERV_EXP_QKV_PAD=1" [c3]="XSERV_EXP_COMBINE_BLOCKS=3"
  [late]="XSERV_EXP_COMBINE_LATE=1" [pad_c3]="XSERV_EXP_QKV_PAD=1 XSERV_EXP_COMBINE_BLOCKS=3"
  [c3_late]="XSERV_EXP_COMBINE_BLOCKS=3 XSERV_EXP_COMBINE_LATE=1"
  [pad_c3_late]="XSERV_EXP_QKV_PAD=1 XSERV_EXP_COMBINE_BLOCKS=3 XSERV_EXP_COMBINE_LATE=1")
VARIANTS="base pad c3 late pad_c3 c3_late pad_c3_late"
variant_sweep KNOBS "$VARIANTS" "pad_c3 c3_late" base
ab() { cmp -s /tmp/tok_$1.txt /tmp/tok_$2.txt && echo "tokens $1/$2 equal" || echo "tokens $1/$2 differ"; }
for v in old pad_c3_late; do
  b=$X; [ $v = old ] && b=$OLD
  timeout 60 $b run /tmp/p_$v --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
    --max-tokens 64 > /tmp/tok_$v.txt 2> /dev/null
done
ab old pad_c3_late
echo "done in $((SECONDS - start)) s"
