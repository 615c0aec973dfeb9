#!/usr/bin/env bash
# One call on nvidia-h200 (issue 17): MXFP4 experts on the GPU. The MXFP4 GPU tests (decode bit
# for bit, MoE kernels and a whole model equal to their BF16 twins), then the synthetic 20b's
# bench rows for a plan compiled with --expert-format bf16 and one with mxfp4, same binary, same
# call. Needs .device/bin/{xserv,codegen_gpu_tests,cli_gpu_tests} and
# .device/data/gpt-oss-20b.json (carry [".device/bin", ".device/data"]). TESTS=0 skips the tests.
source "$(dirname "$0")/common.sh"
export LD_LIBRARY_PATH=$PWD/$B:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ "${TESTS:-1}" = 1 ]; then
  run_tests codegen_gpu_tests
  grep -h "MESSAGE\|rel L2" "$OUT/codegen_gpu_tests.log" | grep -i "mx4\|mxfp4" | head -5
  run_tests cli_gpu_tests -tc="*MXFP4*"
  grep -h "bitwise" "$OUT/cli_gpu_tests.log" | head -3
  echo "== tests done at $((SECONDS - start)) s"
fi
synth20b --reuse
for f in bf16 mxfp4; do
  $X compile /tmp/g20 -o /tmp/p64_$f --max-seq 8192 --max-batch 64 --expert-format $f 2>&1 | tail -1
done
$X inspect /tmp/p64_mxfp4 2>&1 | grep -iE "weights|decode" | head -4
echo "== compiled at $((SECONDS - start)) s"
for f in mxfp4 ${BF16:+bf16}; do
  echo "== bench $f"
  timeout 200 $X bench /tmp/p64_$f --backend cuda -p 512,2048 -n 128 -b 1,64 -r 2 -o csv \
    2> "$OUT/bench_$f.err" | tee "$OUT/bench_$f.csv" | cut -d, -f1-12 | tail -4
  timeout 100 $X bench /tmp/p64_$f --backend cuda -p 0 -n 128 -d 4096 -r 2 -o csv 2> /dev/null |
    tail -1 | cut -d, -f1-12
  grep -iE "GB on the GPU|error" "$OUT/bench_$f.err" | head -2
done
echo "== bench done at $((SECONDS - start)) s"
if [ -n "${NCU:-}" ]; then # Nsight Compute on the MXFP4 MoE kernels of a decode and a prompt step
  for k in moe_gate_up.*mx4 moe_down_part.*mx4 gemm_swiglu.*mx4; do
    timeout 100 ncu --clock-control none --launch-skip 30 --launch-count 1 --kernel-name "regex:$k" \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      $X bench /tmp/p64_mxfp4 --backend cuda -p 512 -n 8 -r 1 > "$OUT/ncu_${k%%.*}.txt" 2>&1
    echo "== $k: ncu rc=$?"
    grep -E "Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issue Slots|Executed Ipc|Grid Size|==PROF==" "$OUT/ncu_${k%%.*}.txt" | head -12
  done
fi
for f in bf16 mxfp4; do
  $X run /tmp/p64_$f --backend cuda --prompt-ids "${PROMPTS[0]}" --max-tokens 32 --raw \
    2> /dev/null | tail -1 > "$OUT/tokens_$f.txt"
done
cmp -s "$OUT/tokens_bf16.txt" "$OUT/tokens_mxfp4.txt" && echo "20b greedy 32 tokens: mxfp4 = bf16" ||
  { echo "20b greedy tokens DIFFER"; head -c 300 "$OUT"/tokens_*.txt; }
echo "== done at $((SECONDS - start)) s"
