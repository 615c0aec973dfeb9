#!/usr/bin/env bash
# Session 12, call 4 (1 GPU, ~4 min): what call 3 could not finish: the MXFP4 GPU tests on the
# new kernels (decode of every scale and code with the 3-instruction nibble pairs, the decode
# kernels, gemm_wg's fragments, the grouped gemms), kernels_bench's tilings, Nsight Compute on
# the default shared-tile gate_up and down, and the 20b's decode rows with a bf16 KV cache.
# Needs .device/bin/{xserv,codegen_gpu_tests,kernels_bench}, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*in-register MXFP4 decode*,*MoE decode kernels on MXFP4*,*tensor-core MoE*,*fragment decode of gemm_wg*,*grouped MoE gemms on MXFP4*"
grep -E "hidden 2880, scales 117" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-250
echo "== bench at $((SECONDS - start)) s"
kb_moe
n=0
for k in moe_gate_up_e32_k4_d2880_i2880_mx4_a16_mma_g4_s2_c8_t moe_down_part_e32_k4_d2880_i2880_mx4_a16_mma_g2_s4_c8_t; do
  n=$((n + 1))
  timeout 120 ncu --clock-control none --launch-skip 3 --launch-count 1 --kernel-name "$k" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section InstructionStats $B/kernels_bench -tc="MXFP4 MoE decode*" > "$OUT/ncu_$n.txt" 2>&1
  echo "== $k: ncu rc=$?"
  grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Waves Per SM|Warp Cycles Per Issued|Executed Instructions  |SM Active Cycles|Elapsed Cycles" "$OUT/ncu_$n.txt" | head -12
done
echo "== 20b, bf16 KV cache, at $((SECONDS - start)) s"
synth20b
$X compile /tmp/g20 -o /tmp/p_kv --max-seq 8192 --max-batch 64 --kv-dtype bf16 > /tmp/c_kv.log 2>&1
tail -1 /tmp/c_kv.log
timeout 100 $X bench /tmp/p_kv --backend cuda -p 0 -n 128 -b 1 -d 0,4096 -r 2 2> /dev/null | grep -E "tg" | cut -d'|' -f6,7,8,11
echo "done in $((SECONDS - start)) s"
