#!/usr/bin/env bash
# One device call: every GPU test, then the full-size synthetic 20b through the CUDA engine
# (run, bench, a GSM8K eval of 20 problems). Build here first and copy into .device/:
#   bin/{xserv,runtime_gpu_tests,codegen_gpu_tests,cli_gpu_tests}
#   data/{gpt-oss-20b.json,o200k_base.tiktoken,gsm8k_test.jsonl}
# and call the device tool with carry [".device/bin", ".device/data"]. Logs land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XSERV_SOURCE_DIR=$PWD
export XSERV_KERNEL_CACHE=/tmp/xserv-kernels NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
B=.device/bin D=.device/data
start=$SECONDS
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
summary=()
for t in runtime_gpu_tests codegen_gpu_tests cli_gpu_tests; do
  timeout 240 $B/$t > "$OUT/$t.log" 2>&1
  rc=$?
  summary+=("$t rc=$rc: $(grep -E '^\[doctest\] test cases' "$OUT/$t.log" | tail -1)")
  grep -E "ERROR|MESSAGE" -A2 "$OUT/$t.log" | grep -vE "^--$" | head -40
done
echo "== GPU tests done at $((SECONDS - start)) s"

$B/xserv synth --config $D/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
$B/xserv compile /tmp/g20 -o /tmp/g20.plan --max-seq 8192 --max-batch 32 2>&1 | tail -2
$B/xserv compile /tmp/g20 -o /tmp/g20-kvbf16.plan --max-seq 8192 --max-batch 32 --kv-dtype bf16 \
  2>&1 | tail -1
ids=$(seq -s, 1000 37 2800)
timeout 150 $B/xserv run /tmp/g20.plan --backend cuda --prompt-ids "$ids" --max-tokens 64 \
  > "$OUT/run20b.log" 2>&1
summary+=("run 20b rc=$?: $(grep -E '^\[run\]' "$OUT/run20b.log" | tail -1)")
grep -E "^\[load\] done|^\[cuda\] (ready|compiling)" "$OUT/run20b.log"
timeout 200 $B/xserv bench /tmp/g20.plan --backend cuda -p 512 -n 128 -b 1,8 -r 3 \
  > "$OUT/bench20b.md" 2> "$OUT/bench20b.err"
summary+=("bench 20b rc=$?")
cat "$OUT/bench20b.md"
for plan in g20 g20-kvbf16; do # KV cache in fp32 (default) vs bf16 at depth
  echo "== $plan: tg128 at depth 0 and 4096"
  timeout 150 $B/xserv bench /tmp/$plan.plan --backend cuda -p 0 -n 128 -d 0,4096 -r 2 \
    2> /dev/null | tail -2
done
timeout 200 $B/xserv eval /tmp/g20.plan --backend cuda --task gsm8k --data $D/gsm8k_test.jsonl \
  --limit 20 --batch 20 --max-tokens 96 --tokenizer $D/o200k_base.tiktoken \
  --out "$OUT/eval20b.jsonl" > "$OUT/eval20b.log" 2>&1
summary+=("eval 20b rc=$?")
grep -A8 "summary" "$OUT/eval20b.log"
echo "== total $((SECONDS - start)) s"
printf '%s\n' "${summary[@]}"
