#!/usr/bin/env bash
# Session 17, call 1 (prepared in session 16; 1 GPU, ~1 min): which stall bounds the MoE decode kernels
# (docs/PERF.md, session 16: they are bound inside the SM, not by DRAM). Nsight Compute's warp
# states and source-level stall samples (SourceCounters, the kernel source imported) of two
# launches each of moe_gate_up and moe_down_part at one token, and of attention_combine at depth
# 4096 (6.8 us in the timeline), graphs off, clocks and caches left alone, from `xserv bench` on
# the 20b; each report's source page as SASS with its samples per instruction comes back as CSV
# (NVRTC kernels carry no line information). Needs .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > /tmp/c_new.log 2>&1
tail -1 /tmp/c_new.log
profile() { # profile KERNEL_REGEX DEPTH
  local k=$1 depth=$2
  XSERV_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none \
    --kernel-name "regex:$k" --launch-skip 60 --launch-count 2 --import-source yes \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section InstructionStats --section SourceCounters \
    --export "/tmp/ncu_$k" \
    $X bench /tmp/p_new --backend cuda -p 0 -n 8 -b 1 -d "$depth" -r 1 > "$OUT/ncu_$k.txt" 2>&1
  echo "== $k (depth $depth): ncu rc=$?"
  # Per SASS instruction: stall samples by reason (the kernels carry no line info).
  ncu --import "/tmp/ncu_$k.ncu-rep" --page source --print-source sass --csv \
    > "$OUT/sass_$k.csv" 2> "$OUT/sass_$k.err"
  echo "   sass page: $(wc -l < "$OUT/sass_$k.csv") lines"
  grep -E "Duration|Registers Per|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Stall|==PROF==" \
    "$OUT/ncu_$k.txt" | head -40
  grep -E "^    (OPT|INF|WRN)" -A3 "$OUT/ncu_$k.txt" | cut -c1-300 | head -30
}
profile moe_gate_up 0
profile moe_down_part 0
profile attention_combine 4096
echo "done in $((SECONDS - start)) s"
