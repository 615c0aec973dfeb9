#!/usr/bin/env bash
# Session 9 (1 GPU, ~2 min): Nsight Compute on the warpgroup-MMA gemms of a 64-sequence decode
# step of the synthetic 20b (MXFP4 experts): speed of light, occupancy, warp stalls, issue
# slots, for one layer's qkv, o_proj, MoE gate_up and down launches. Needs .device/bin/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
XSERV_CUDA_GRAPHS=0 timeout 300 ncu --clock-control none --kernel-name regex:"gemmwg" \
  --launch-skip "${NCU_SKIP:-480}" --launch-count 8 --section SpeedOfLight --section Occupancy \
  --section LaunchStats --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
  $X bench /tmp/p64 --backend cuda -p 0 -n 8 -b 64 -r 1 > "$OUT/ncu.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Waves Per SM|Grid Size|Dynamic Shared|Issue Slots Busy|Issued Warp Per|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Stall|L2 Hit|Mem Busy|Max Bandwidth|Block Limit" \
  "$OUT/ncu.txt" | grep -v "stalled_.*_per_issue_active" | head -150
echo "-- stall reasons (warps per issue, > 0.05)"
awk '/^  [a-z_]+.*\(/ {print} /stalled_.*_per_issue_active/ && $NF+0 > 0.05 {print "   ", $1, $NF}' \
  "$OUT/ncu.txt" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | head -120
echo "== done at $((SECONDS - start)) s"
