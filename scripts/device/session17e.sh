#!/usr/bin/env bash
# Session 17, call 5 (1 GPU, ~4 min): every row of issue 17 from the code as it lands (its
# kernels are 6d3ca8a's: the session's patches were not kept), in one call: pp512, pp2048,
# tg128, tg128 @ d4096 (batch 1), tg128 x B64, with bench's peak-memory column, on the plan
# `compile --max-seq 8192 --max-batch 64`, and the batch-1 plan (max-batch 1) for the peak memory
# of the 20b at 8192 x 1. Needs .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 > /tmp/c64.log 2>&1 &
$X compile /tmp/g20 -o /tmp/p1 --max-seq 8192 --max-batch 1 > /tmp/c1.log 2>&1 &
wait
tail -1 /tmp/c64.log
for round in 1 2; do
  echo "-- round $round, max-batch 64 plan"
  timeout 150 $X bench /tmp/p64 --backend cuda -p 512,2048 -n 128 -b 1 -d 0,4096 -r 2 2> /dev/null |
    grep -E "pp|tg"
  timeout 100 $X bench /tmp/p64 --backend cuda -p 0 -n 128 -b 64 -r 2 2> /dev/null | grep -E "tg"
done
echo "-- max-batch 1 plan"
timeout 100 $X bench /tmp/p1 --backend cuda -p 512 -n 128 -b 1 -d 0 -r 2 2> /dev/null | grep -E "pp|tg"
echo "done in $((SECONDS - start)) s"
