#!/usr/bin/env bash
# One call on nvidia-h200 (issue 15's numbers): the synthetic 20b's bench rows with the binary
# before the engine (.device/old/xserv) and after it, on the same GPU in the same call; then the
# engine's serving benchmark (256 requests of 512 prompt and 256 output tokens at concurrency 64
# and 16 at concurrency 1), whose ideal is computed from the same call's pp512 and B64 rows;
# then the engine GPU tests (batch invariance on the tiny model and the 20b).
# Needs .device/bin/{xserv,engine_gpu_tests}, .device/old/xserv and .device/data/gpt-oss-20b.json
# (carry [".device/bin", ".device/old", ".device/data"]). SKIP_OLD=1 leaves the old binary out.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
synth20b
OLD=.device/old/xserv
for v in new old; do
  [ "$v" = old ] && { [ -n "${SKIP_OLD:-}" ] || [ ! -x $OLD ]; } && continue
  bin=$X; [ "$v" = old ] && bin=$OLD
  $bin compile /tmp/g20 -o /tmp/p64_$v --max-seq 8192 --max-batch 64 2>&1 | tail -1
done
echo "== compiled at $((SECONDS - start)) s"
for v in new old new2; do # new twice: the spread of one binary between runs
  bin=$X plan=/tmp/p64_new
  if [ "$v" = old ]; then
    [ -n "${SKIP_OLD:-}" ] || [ ! -x $OLD ] && continue
    bin=$OLD plan=/tmp/p64_old
  fi
  echo "== bench $v"
  timeout 200 $bin bench $plan --backend cuda -p 512,2048 -n 128 -b 1,64 -r 3 -o csv \
    2> "$OUT/bench_$v.err" | tee "$OUT/bench_$v.csv" | cut -d, -f1-12 | tail -4
  timeout 100 $bin bench $plan --backend cuda -p 0 -n 128 -d 4096 -r 2 -o csv 2> /dev/null |
    tail -1 | cut -d, -f1-12
done
echo "== bench done at $((SECONDS - start)) s"
echo "== serving, concurrency 64"
timeout 240 $X bench /tmp/p64_new --backend cuda --requests 256 --concurrency 64 --input-len 512 \
  --output-len 256 2> "$OUT/serve64.err" | tee "$OUT/serve64.md"
echo "== serving, concurrency 1"
timeout 120 $X bench /tmp/p64_new --backend cuda --requests 8 --concurrency 1 --input-len 512 \
  --output-len 256 2> "$OUT/serve1.err" | grep -E "output token|TPOT|TTFT median|scheduler"
echo "== serving done at $((SECONDS - start)) s"
XSERV_20B_CKPT=/tmp/g20 run_tests engine_gpu_tests
grep -h "batch invariance" "$OUT/engine_gpu_tests.log"
echo "== done at $((SECONDS - start)) s"
