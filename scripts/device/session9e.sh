#!/usr/bin/env bash
# Session 9 (1 GPU, ~1 min): per-op profiles of the synthetic 20b's batch-1 decode (depth 0 and
# 640) and a 512-token prompt step under today's defaults. Needs .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
for d in 0 640; do
  XSERV_PROFILE=1 timeout 100 $X bench /tmp/p64 --backend cuda -p 512 -n 32 -b 1 -d $d -r 1 \
    > "$OUT/profile_d$d.log" 2>&1
  echo "-- depth $d"; grep -E "profile" "$OUT/profile_d$d.log" | head -40
done
echo "done in $((SECONDS - start)) s"
