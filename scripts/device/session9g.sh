#!/usr/bin/env bash
# Session 9 (1 GPU, ~5 min): gemm_wg with its cp.async pieces computed once per block and the
# MXFP4 scale as two branch-free multiplies (the instruction count of a K tile: 623 -> 345 at
# 16 tokens). The gemm_wg GPU tests and the other GPU tests; then the old binary (.device/old,
# HEAD before) against the new one: bench rows, B64 at depth 640, greedy tokens of the 20b (must
# be equal: same values, same sums), serving at concurrency 64; Nsight Compute on the B64 MoE
# gemms. Needs .device/bin/{xserv,codegen,engine,cli,runtime}_gpu_tests, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*gemm_wg*,*MXFP4*,*mxfp4*"
run_tests engine_gpu_tests
run_tests cli_gpu_tests -tce="*synthetic 20b*"
synth20b
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > "$OUT/c_old.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > "$OUT/c_new.log" 2>&1 &
wait
echo "== compiled at $((SECONDS - start)) s"
ids=$(seq -s, 1000 37 8000)
for v in old new; do
  bin=$X; [ $v = old ] && bin=$OLD
  echo "-- $v"
  timeout 150 $bin bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 1,64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 100 $bin bench /tmp/p_$v --backend cuda -p 0 -n 64 -b 64 -d 640 -r 1 2> /dev/null |
    grep -E "tg" | cut -d'|' -f6,7,8,11
  timeout 60 $bin run /tmp/p_$v --backend cuda --prompt-ids $ids --max-tokens 32 \
    > "$OUT/run_$v.txt" 2> /dev/null
done
cmp -s "$OUT/run_old.txt" "$OUT/run_new.txt" && echo "greedy 32 (190-token prompt): new == old" ||
  echo "greedy 32: new DIFFERS from old"
echo "== serving at $((SECONDS - start)) s"
timeout 120 $X bench /tmp/p_new --backend cuda --requests 256 --concurrency 64 --input-len 512 \
  --output-len 256 > "$OUT/serve_new.md" 2> /dev/null
grep -E "output token|TTFT (median|p99)|TPOT (median|p99)" "$OUT/serve_new.md" | cut -c1-80 | tr '\n' ' '
echo
XSERV_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --kernel-name regex:"gemmwg_(swiglu|scatter)" \
  --launch-skip 240 --launch-count 2 --section SpeedOfLight --section Occupancy --section LaunchStats \
  --section SchedulerStats $X bench /tmp/p_new --backend cuda -p 0 -n 8 -b 64 -r 1 > "$OUT/ncu.txt" 2>&1
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Issue Slots Busy|Registers Per|Achieved Occupancy|No Eligible" "$OUT/ncu.txt"
echo "done in $((SECONDS - start)) s"
