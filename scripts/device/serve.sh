#!/usr/bin/env bash
# One call on nvidia-h200 (issues 15 and 16): the engine's serving benchmark under scheduling
# variants (ADMIT: --admit-batch values; one run with 2048-token sub-steps), then the same
# 512-request workload (512 prompt / 256 output tokens, 64 concurrent streaming clients) through
# the engine in-process and through `xserv serve` over HTTP, for the HTTP + JSON cost.
# Needs .device/bin/xserv (+ libcpp-httplib beside it), .device/data/{gpt-oss-20b.json,
# o200k_base.tiktoken}; carry [".device/bin", ".device/data"].
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
W="--requests 256 --concurrency 64 --input-len 512 --output-len 256"
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)|ITL p99|engine steps|admit" "$1" | tr '\n' ' '; echo; }
for a in ${ADMIT-1 4 8}; do
  echo "== engine, admit batch $a"
  timeout 150 $X bench /tmp/p64 --backend cuda $W --admit-batch $a > "$OUT/admit$a.md" 2> /dev/null
  show "$OUT/admit$a.md"
done
echo "== engine, 2048-token sub-steps, admit batch 4"
XSERV_PREFILL_CHUNK=2048 timeout 150 $X bench /tmp/p64 --backend cuda $W --admit-batch 4 \
  --max-tokens-per-step 4096 > "$OUT/chunk2048.md" 2> /dev/null
show "$OUT/chunk2048.md"
echo "== variants done at $((SECONDS - start)) s"
W512="--requests 512 --concurrency 64 --input-len 512 --output-len 256 ${SERVE_FLAGS:-}"
echo "== engine in-process, 512 requests"
timeout 150 $X bench /tmp/p64 --backend cuda $W512 > "$OUT/engine512.md" 2> /dev/null
show "$OUT/engine512.md"
$X serve /tmp/p64 --port 8321 --tokenizer $D/o200k_base.tiktoken ${SERVE_FLAGS:-} \
  > "$OUT/serve.log" 2>&1 &
pid=$!
for i in $(seq 120); do curl -sf localhost:8321/health > /dev/null && break; sleep 0.5; done
echo "== server ready at $((SECONDS - start)) s: $(curl -s localhost:8321/health)"
echo "== HTTP, 512 requests"
timeout 150 $X bench --endpoint http://127.0.0.1:8321 $W512 --vocab 201088 > "$OUT/http512.md" 2>&1
show "$OUT/http512.md"
grep -E "completed|first error" "$OUT/http512.md"
kill -TERM $pid; wait $pid; echo "server exit code $?"
tail -2 "$OUT/serve.log"
echo "== done at $((SECONDS - start)) s"
