#!/usr/bin/env bash
# Session 13, call 3 (1 GPU, ~3 min): why the router and decode attention of a batch-1 step take
# ~5.5 us each inside the graph (XSERV_PROFILE_REPEAT, 13b) for microseconds of work: Nsight
# Compute's warp states, scheduler and source-level stall counters on two launches of each
# (graphs off, clocks and caches left alone), from `xserv bench` on the 20b. Needs
# .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > /tmp/c_new.log 2>&1
tail -1 /tmp/c_new.log
for k in rmsnorm_router_topk attention_decode moe_gate_up; do
  XSERV_CUDA_GRAPHS=0 timeout 150 ncu --clock-control none --cache-control none \
    --kernel-name "regex:$k" --launch-skip 60 --launch-count 2 \
    --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
    --section SchedulerStats --section SourceCounters \
    $X bench /tmp/p_new --backend cuda -p 0 -n 8 -b 1 -r 1 > "$OUT/ncu_$k.txt" 2>&1
  echo "== $k: ncu rc=$?"
  grep -E "Duration|Elapsed Cycles|Registers Per|Grid Size|Cluster|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Achieved Occupancy|Stall|ERR|==PROF==" \
    "$OUT/ncu_$k.txt" | head -40
  grep -E "^    (OPT|INF|WRN)" -A3 "$OUT/ncu_$k.txt" | cut -c1-300 | head -30
done
echo "done in $((SECONDS - start)) s"
