#!/usr/bin/env bash
# Session 10's last call (1 GPU, ~2 min): issue 15's serving bar at HEAD (db41f87) with every
# default (token budget 8192): the same call's pp512 and B64 rows for the no-overlap ideal,
# serving 256 x 512+256 at concurrency 64, and 8 such requests at concurrency 1 with tg128 (TPOT
# against tg128). Needs .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 > /tmp/c64.log 2>&1
echo "== compiled at $((SECONDS - start)) s"
timeout 60 $X bench /tmp/p64 --backend cuda -p 512 -n 128 -b 1,64 -r 1 2> /dev/null |
  grep -E "pp|tg" | cut -d'|' -f6,7,8,11
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)|ITL p99|host share" "$1" | cut -c1-80 | tr '\n' ' '; echo; }
timeout 60 $X bench /tmp/p64 --backend cuda --requests 256 --concurrency 64 --input-len 512 \
  --output-len 256 > "$OUT/serve64.md" 2> /dev/null
show "$OUT/serve64.md"
timeout 40 $X bench /tmp/p64 --backend cuda --requests 8 --concurrency 1 --input-len 512 \
  --output-len 256 > "$OUT/serve1.md" 2> /dev/null
show "$OUT/serve1.md"
echo "done in $((SECONDS - start)) s"
