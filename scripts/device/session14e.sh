#!/usr/bin/env bash
# Session 14, call 5 (1 GPU, ~3 min): is the first (DRAM-cold) launch of the MoE GEMVs short of
# bytes in flight? 14d: their leaner loop (14a) cut the cost of a second, L2-warm launch
# (gate_up 15.2 -> 12.6 us) but not the step. The same kernels with a deeper ring (the
# lowering's kMoeMmaStages 3 and 4: 2 and 3 chunks in flight a warp) against 2 and the old
# binary (e85ce67), two rounds of the decode rows, then batch 8. Needs .device/bin/xserv,
# .device/{old,s3,s4}/xserv (the same source built with kMoeMmaStages 3, 4), .device/data.
source "$(dirname "$0")/common.sh"
synth20b
declare -A BIN=([old]=.device/old/xserv [s2]=$X [s3]=.device/s3/xserv [s4]=.device/s4/xserv)
for v in old s2 s3 s4; do
  ${BIN[$v]} compile /tmp/g20 -o /tmp/p_$v --max-seq 8192 --max-batch 64 > /tmp/c_$v.log 2>&1 &
done
wait
grep -h "moe_gate_up\|error" /tmp/c_s4.log | head -3
for v in s3 s4; do
  echo "$v gate_up kernels: $(grep -rhoa 'moe_gate_up_[a-z0-9_]*' /tmp/p_$v 2>/dev/null | sort -u | head -2 | tr '\n' ' ')"
done
for round in 1 2; do
  for v in old s2 s3 s4; do
    echo "-- $v: $(timeout 100 ${BIN[$v]} bench /tmp/p_$v --backend cuda -p 0 -n 128 -b 1 \
      -d 0,4096 -r 2 2> /dev/null | grep -E "tg" | cut -d'|' -f6,7 | tr '\n' ' ')"
  done
done
for v in s2 s3 s4; do
  echo "-- $v B8: $(timeout 100 ${BIN[$v]} bench /tmp/p_$v --backend cuda -p 0 -n 128 -b 8 -r 2 \
    2> /dev/null | grep -E "tg" | cut -d'|' -f6,7)"
done
for v in s2 s3; do
  timeout 60 ${BIN[$v]} run /tmp/p_$v --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
    --max-tokens 64 > /tmp/tok_$v.txt 2> /dev/null
done
cmp -s /tmp/tok_s2.txt /tmp/tok_s3.txt && echo "greedy tokens s2/s3: equal" || echo "greedy tokens s2/s3: differ"
echo "done in $((SECONDS - start)) s"
