#!/usr/bin/env bash
# Session 15, call 3 (1 GPU, ~3 min): 15d's combine folds reverted (slower: see docs/PERF.md);
# o_proj's one-token kernel with its rows resident in shared memory alone, old (b086909)
# against new, two rounds and batch 8, then both binaries' timelines at depth 0 and 4096 (the
# old binary's: o_proj's FMA kernel in the same account). Needs .device/bin/xserv,
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
for v in old new; do
  "$(bin_of $v)" compile /tmp/g20 -o /tmp/p_tl_$v --max-seq 8192 --max-batch 64 --timeline \
    > /tmp/c_tl_$v.log 2>&1 &
done
ab_tokens 64
ab_decode 2
ab_batch 8
wait
for v in old new; do
  for args in "-b 1 -d 0" "-b 1 -d 4096"; do
    echo "== $v timeline $args"
    timeout 100 "$(bin_of $v)" bench /tmp/p_tl_$v --backend cuda -p 0 -n 128 $args -r 1 \
      2> "$OUT/tl.log" | grep -E "tg" | cut -d'|' -f6,7
    grep -E "^\[timeline\]" "$OUT/tl.log" | sed -n '1p;3,13p' | cut -c1-118
    cp "$OUT/tl.log" "$OUT/tl_${v}_${args// /}.log"
  done
done
echo "done in $((SECONDS - start)) s"
