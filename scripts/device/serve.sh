#!/usr/bin/env bash
# The serving benchmark of the synthetic 20b in one call (nvidia-h200, ~3 min; ~6 with
# ROBUST=1): 256 requests of 512 prompt + 256 output tokens at concurrency 64 (and 8 at
# concurrency 1) through the engine in process, then the same 256 through `xserv serve` over
# HTTP (POST /v1/completions, streaming), with the pp512 and B64 rows of the same call for the
# no-overlap ideal N*O / (N*I / pp512 + N*O / B64).
#   ROBUST=1        then the robustness probe: 1,000 requests of which a third hang up
#                   mid-stream; /metrics must show nothing running and no KV block in use, a
#                   greedy probe must get a fresh server's tokens; a request with 256 idle
#                   connections open; SIGTERM must drain and exit 0
#   SERVE_FLAGS=... engine flags both the in-process bench and `xserv serve` take
#                   (--max-running N, --max-tokens-per-step N)
# llama-server beside it: llama.sh. Needs .device/bin/xserv,
# .device/data/{gpt-oss-20b.json,o200k_base.tiktoken}; carry [".device/bin", ".device/data"].
source "$(dirname "$0")/common.sh"
gpu_info
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
W="--requests 256 --concurrency 64 --input-len 512 --output-len 256"
PORT=8321
echo "== pp512 and B64 rows (the ideal)"
rows p64 $X /tmp/p64 -p 512 -n 128 -b 64 -r 2
echo "== engine in process, c64"
# shellcheck disable=SC2086
timeout 200 $X bench /tmp/p64 --backend cuda $W ${SERVE_FLAGS:-} > "$OUT/engine_c64.md" 2> /dev/null
serving_lines "$OUT/engine_c64.md"
echo "== engine in process, c1 (8 requests)"
# shellcheck disable=SC2086
timeout 100 $X bench /tmp/p64 --backend cuda --requests 8 --concurrency 1 --input-len 512 \
  --output-len 256 ${SERVE_FLAGS:-} > "$OUT/engine_c1.md" 2> /dev/null
serving_lines "$OUT/engine_c1.md"
echo "== engine done at $(at)"

# start_server LOG: `xserv serve` on PORT in the background, its pid in $pid.
start_server() {
  # shellcheck disable=SC2086
  $X serve /tmp/p64 --port $PORT --tokenizer $D/o200k_base.tiktoken --max-running 64 \
    ${SERVE_FLAGS:-} > "$OUT/$1" 2>&1 &
  pid=$!
  wait_health $PORT $pid 120 || { tail -5 "$OUT/$1"; exit 1; }
}
start_server serve.log
echo "== HTTP, c64 (server ready at $(at))"
timeout 240 $X bench --endpoint http://127.0.0.1:$PORT $W > "$OUT/http_c64.md" 2>&1
serving_lines "$OUT/http_c64.md"

if [ "${ROBUST:-0}" = 1 ]; then
  # probe: a greedy completion of fixed ids, its text as hex.
  probe() {
    curl -s localhost:$PORT/v1/completions -H 'Content-Type: application/json' \
      -d '{"model":"gpt-oss","prompt":[1000,2000,3000,4000,5000],"max_tokens":24,"temperature":0}' |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"].encode().hex())'
  }
  echo "== 1000 requests, a third hang up mid-stream ($(at))"
  timeout 300 $X bench --endpoint http://127.0.0.1:$PORT --requests 1000 --concurrency 64 \
    --input-len 512 --output-len 256 --disconnect 0.33 > /tmp/disconnect.md 2>&1
  grep -E "completed|disconnected|output token|first error" /tmp/disconnect.md | tr '\n' ' '; echo
  curl -s localhost:$PORT/metrics | grep -E "^xserv:(num_requests_(running|waiting)|kv_blocks_in_use) "
  after=$(probe)
  echo "== 256 idle connections, then a request"
  python3 - $PORT << 'PY' &
import socket, sys, time
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(256)]
time.sleep(20)
PY
  idle=$!
  sleep 2
  t0=$SECONDS
  reply=$(curl -s -m 15 localhost:$PORT/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"gpt-oss","prompt":[1,2,3],"max_tokens":8}')
  rc=$?
  echo "${reply:0:160}"
  echo "request with 256 idle connections open: rc=$rc in $((SECONDS - t0)) s"
  kill $idle 2> /dev/null
  echo "== SIGTERM"
  stop_server $pid
  tail -1 "$OUT/serve.log"
  start_server serve_fresh.log
  fresh=$(probe)
  [ -n "$after" ] && [ "$after" = "$fresh" ] && echo "probe after the hang-ups: a fresh server's tokens" ||
    echo "probe DIFFERS: '$after' against a fresh server's '$fresh'"
fi
stop_server $pid
echo "== done at $(at)"
