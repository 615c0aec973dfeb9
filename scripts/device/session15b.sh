#!/usr/bin/env bash
# The next session's second call (1 GPU, ~3 min): the first run of a timeline plan (compile
# --timeline, session 14: written and tested without a GPU). The 20b's decode step kernel by
# kernel inside the CUDA graph, at depth 0 and 4096 and for batch 8, next to the plain plan's
# rows (the stamps cost a clock read and an atomic a block). Check first that the report is
# sane: its launches a step should be the plan's launches_per_decode_step, its shares should sum
# to the step (1 / tg128) less the host's gaps. Needs .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p_plain --max-seq 8192 --max-batch 64 > /tmp/c_plain.log 2>&1 &
$X compile /tmp/g20 -o /tmp/p_tl --max-seq 8192 --max-batch 64 --timeline > /tmp/c_tl.log 2>&1
wait
tail -1 /tmp/c_tl.log
$X inspect /tmp/p_tl | grep -E "options|launches" | head -3
echo "-- plain: $(timeout 100 $X bench /tmp/p_plain --backend cuda -p 0 -n 128 -b 1 -d 0,4096 \
  -r 1 2> /dev/null | grep -E "tg" | cut -d'|' -f6,7 | tr '\n' ' ')"
for args in "-b 1 -d 0" "-b 1 -d 4096" "-b 8 -d 0"; do
  echo "== timeline $args"
  timeout 100 $X bench /tmp/p_tl --backend cuda -p 0 -n 128 $args -r 1 2> "$OUT/tl.log" |
    grep -E "tg" | cut -d'|' -f6,7
  grep -E "^\[timeline\]" "$OUT/tl.log" | head -16
done
echo "done in $((SECONDS - start)) s"
