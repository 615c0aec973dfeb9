#!/usr/bin/env bash
# One short call on nvidia-h200: the HF batch fixtures' GPU tests at their measured tolerances,
# and B64 for --expert-format bf16 and both in the same call (both plans run the same BF16 gemms
# for a 64-sequence decode step). Needs .device/bin/{xserv,cli_gpu_tests} and
# .device/data/gpt-oss-20b.json (carry [".device/bin", ".device/data"]).
source "$(dirname "$0")/common.sh"
export LD_LIBRARY_PATH=$PWD/$B:$LD_LIBRARY_PATH
run_tests cli_gpu_tests -tc="*batch fixture*,*MXFP4*"
grep -h "MESSAGE" "$OUT/cli_gpu_tests.log" | cut -c1-220 | head -8
synth20b
for f in bf16 both bf16 both; do
  [ -d /tmp/p_$f ] || $X compile /tmp/g20 -o /tmp/p_$f --max-seq 8192 --max-batch 64 --expert-format $f 2>&1 | tail -1
  echo "$f: $(timeout 60 $X bench /tmp/p_$f --backend cuda -p 0 -n 128 -b 64 -r 2 -o csv 2> /dev/null | tail -1 | cut -d, -f5,10,11)"
done
echo "== done at $((SECONDS - start)) s"
