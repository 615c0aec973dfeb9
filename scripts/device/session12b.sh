#!/usr/bin/env bash
# Session 12, call 2 (1 GPU, ~4 min): the tensor-core MoE decode kernels with their weights
# through a shared tile (cp.async + ldmatrix: Mx4MmaTileRows) next to call 1's register loads:
# their GPU test, kernels_bench's sweep (FMA, register and shared tilings), and Nsight Compute
# on gate_up (FMA, registers, shared) and the shared down rows: where the time goes. Needs
# .device/bin/{codegen_gpu_tests,kernels_bench}.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*tensor-core MoE*"
grep -E "hidden 2880, scales 117" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-250
echo "== bench at $((SECONDS - start)) s"
kb_moe
n=0
for k in moe_gate_up_e32_k4_d2880_i2880_mx4_a16 moe_gate_up_e32_k4_d2880_i2880_mx4_a16_mma_g4_s2_c8 \
  moe_gate_up_e32_k4_d2880_i2880_mx4_a16_mma_g4_s2_c8_t \
  moe_down_part_e32_k4_d2880_i2880_mx4_a16_mma_g2_s4_c8_t; do
  n=$((n + 1))
  timeout 120 ncu --clock-control none --launch-skip 3 --launch-count 1 --kernel-name "$k" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section InstructionStats \
    $B/kernels_bench -tc="MXFP4 MoE decode*" > "$OUT/ncu_$n.txt" 2>&1
  echo "== $k: ncu rc=$?"
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit (Reg|Shared)|Waves Per SM|Warp Cycles Per Issued|Mem Busy|L1/TEX Hit|Executed Instructions  |Issue Slots Busy|Static Shared" "$OUT/ncu_$n.txt" | head -20
  grep -E "^    (OPT|WRN)" -A2 "$OUT/ncu_$n.txt" | cut -c1-200 | grep -iE "stall|cycles|bank|uncoalesced|excessive" | head -6
done
echo "done in $((SECONDS - start)) s"
