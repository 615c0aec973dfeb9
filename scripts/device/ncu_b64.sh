#!/usr/bin/env bash
# One call (about 1 minute): where a batched decode step (64 sequences) of the synthetic 20b
# spends its time: the bench row, the per-op profile (XSERV_PROFILE=1, graphs off), then Nsight
# Compute on one layer's gemm, moe_sort, moe_combine and attention launches (NCU_SKIP launches of
# those kernels skipped first). Needs .device/bin/xserv and .device/data/gpt-oss-20b.json (carry
# [".device/bin", ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
synth20b --reuse
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
timeout 120 $X bench /tmp/p64 --backend cuda -p 512 -n 32 -b 64 -r 2 2>/dev/null | grep -E "^\| gpt"
XSERV_PROFILE=1 timeout 120 $X bench /tmp/p64 --backend cuda -p 512 -n 16 -b 64 -r 1 2>&1 \
  >/dev/null | grep -E "^\[profile\]" | head -40
XSERV_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none \
  --kernel-name regex:"gemm|moe_sort|moe_combine|attention" --launch-skip "${NCU_SKIP:-400}" \
  --launch-count 8 --section SpeedOfLight --section Occupancy --section LaunchStats \
  $X bench /tmp/p64 --backend cuda -p 0 -n 4 -b 64 -r 1 > "$OUT/ncu_b64.txt" 2>&1
echo "ncu rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Waves Per SM|Grid Size|Dynamic Shared" \
  "$OUT/ncu_b64.txt" | head -80
echo "== done at $((SECONDS - start)) s"
