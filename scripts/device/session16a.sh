#!/usr/bin/env bash
# Session 16, call 1 (1 GPU, ~4 min): moe_gate_up asking L2 for the down rows of its experts
# (MoeDims::prefetch_down, compile-time XSERV_EXP_PREFETCH_DOWN 0, 1, 2 while it is measured):
# greedy tokens of the three plans compared, the batch-1 rows twice each, batch 8, then each
# variant's timeline at depth 0 and 4096. Needs .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
for pf in 0 1 2; do
  XSERV_EXP_PREFETCH_DOWN=$pf $X compile /tmp/g20 -o /tmp/p_$pf --max-seq 8192 --max-batch 64 \
    > /tmp/c_$pf.log 2>&1 &
done
wait
tail -1 /tmp/c_0.log
for pf in 0 1 2; do
  XSERV_EXP_PREFETCH_DOWN=$pf $X compile /tmp/g20 -o /tmp/p_tl_$pf --max-seq 8192 \
    --max-batch 64 --timeline > /tmp/c_tl_$pf.log 2>&1 &
done
for pf in 0 1 2; do
  timeout 60 $X run /tmp/p_$pf --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
    --max-tokens 64 > /tmp/tok_$pf.txt 2> /dev/null
done
for pf in 1 2; do
  cmp -s /tmp/tok_0.txt /tmp/tok_$pf.txt && echo "greedy tokens pf0/pf$pf: equal" ||
    echo "greedy tokens pf0/pf$pf: differ"
done
for round in 1 2; do
  for pf in 0 1 2; do
    echo "-- pf$pf (round $round)"
    timeout 100 $X bench /tmp/p_$pf --backend cuda -p 0 -n 128 -b 1 -d 0,4096 -r 2 \
      2> /dev/null | grep -E "tg" | cut -d'|' -f6,7,8,11
  done
done
for pf in 0 1 2; do
  echo "-- pf$pf B8"
  timeout 100 $X bench /tmp/p_$pf --backend cuda -p 0 -n 128 -b 8 -r 2 2> /dev/null |
    grep -E "tg" | cut -d'|' -f6,7,8,11
done
wait
for pf in 0 1 2; do
  for args in "-b 1 -d 0" "-b 1 -d 4096"; do
    echo "== pf$pf timeline $args"
    timeout 100 $X bench /tmp/p_tl_$pf --backend cuda -p 0 -n 128 $args -r 1 \
      2> "$OUT/tl.log" | grep -E "tg" | cut -d'|' -f6,7
    grep -E "^\[timeline\]" "$OUT/tl.log" | sed -n '1p;3,13p' | cut -c1-118
    cp "$OUT/tl.log" "$OUT/tl_pf${pf}_${args// /}.log"
  done
done
echo "done in $((SECONDS - start)) s"
