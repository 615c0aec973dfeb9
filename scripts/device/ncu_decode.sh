#!/usr/bin/env bash
# One call (about 2 minutes, Firecracker machines only): Nsight Compute on the 20b-shaped decode
# kernels of the bandwidth tests (MoE gate_up / down_part / combine, qkv, o_proj), the 4th launch
# of each: throughput, occupancy, launch statistics, memory and warp stall reasons, clocks left
# alone. Needs .device/bin/codegen_gpu_tests (carry [".device/bin", ".device/data"]). Logs land
# in $OUT.
source "$(dirname "$0")/common.sh"
for k in ${NCU_KERNELS:-moe_gate_up_e32_k4_d2880_i2880 moe_down_part_e32_k4_d2880_i2880 \
  moe_combine_residual_d2880_k4 qkv_decode_k2880_q4096_k512_v512 linear_residual_k4096_n2880}; do
  timeout 120 ncu --clock-control none --launch-skip 3 --launch-count 1 --kernel-name "$k" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis \
    $B/codegen_gpu_tests -tc="*tuning variants*,*20b-shaped*" > "$OUT/ncu_$k.txt" 2>&1
  echo "== $k: ncu rc=$?"
  grep -E "Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Waves Per SM|Grid Size|Warp Cycles Per Issued|Mem Busy|Max Bandwidth|L2 Hit|Dynamic Shared|Static Shared|ERR|==PROF==" "$OUT/ncu_$k.txt" | head -24
  grep -E "^    (OPT|INF|WRN)" -A2 "$OUT/ncu_$k.txt" | cut -c1-240 | head -12
done
