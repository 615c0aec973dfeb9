#!/usr/bin/env bash
# One call (about 1.5 minutes): why the tensor-core gemms of a 512-token prefill step of the
# synthetic 20b run where they do: Nsight Compute on NCU_COUNT launches of the gemm kernels
# (after NCU_SKIP), with throughput, occupancy, scheduler and warp-stall statistics and the
# rules' advice. Needs .device/bin/xserv and .device/data/gpt-oss-20b.json (carry
# [".device/bin", ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
synth20b --reuse
$X compile /tmp/g20 -o /tmp/p512 --max-seq 4096 --max-batch 8 2>&1 | tail -1
XSERV_CUDA_GRAPHS=0 timeout 300 ncu --clock-control none --kernel-name regex:"${NCU_KERNELS:-gemm_}" \
  --launch-skip "${NCU_SKIP:-12}" --launch-count "${NCU_COUNT:-5}" --section SpeedOfLight \
  --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
  --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --print-details all \
  $X bench /tmp/p512 --backend cuda -p 512 -n 1 -b 1 -r 1 > "$OUT/ncu_prefill.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp Per Scheduler|No Eligible|Stall|L1/TEX Hit|L2 Hit|Executed Ipc|Issue Slots Busy|Tensor|Shared Memory|Bank" \
  "$OUT/ncu_prefill.txt" | cut -c1-160 | head -120
grep -E "^    (OPT|WRN)" -A3 "$OUT/ncu_prefill.txt" | cut -c1-300 | head -40
echo "== done at $((SECONDS - start)) s"
