#!/usr/bin/env bash
# One call on nvidia-h200 (issue 16's robustness checks, after engine.sh's measurements in the
# same call when RUN_ENGINE=1): `xserv serve` on the synthetic 20b takes 1,000 streaming requests
# (512 prompt / 256 output tokens, 64 at a time) of which a third hang up mid-stream; afterwards
# /metrics must show nothing running and every KV row free, and a greedy request must get the
# tokens a fresh server gives. 256 idle connections must not stop a request from being served;
# SIGTERM must drain and exit 0. Needs .device/bin/xserv (+ libcpp-httplib beside it) and
# .device/data/{gpt-oss-20b.json,o200k_base.tiktoken}.
source "$(dirname "$0")/common.sh"
[ -n "${RUN_ENGINE:-}" ] && bash scripts/device/engine.sh
synth20b --reuse
[ -d /tmp/p64_new ] || $X compile /tmp/g20 -o /tmp/p64_new --max-seq 8192 --max-batch 64 2>&1 | tail -1
for a in ${ADMIT-1 4}; do
  echo "== engine serving, admit batch $a"
  timeout 150 $X bench /tmp/p64_new --backend cuda --requests 256 --concurrency 64 --input-len 512 \
    --output-len 256 --admit-batch $a 2> /dev/null > "$OUT/admit$a.md"
  grep -E "output token|TTFT (median|p99)|TPOT median|ITL p99" "$OUT/admit$a.md" | tr '\n' ' '; echo
done
PORT=8322
start_server() {
  $X serve /tmp/p64_new --port $PORT --tokenizer $D/o200k_base.tiktoken > "$OUT/$1.log" 2>&1 &
  pid=$!
  for i in $(seq 120); do curl -sf localhost:$PORT/health > /dev/null && return; sleep 0.5; done
  echo "server did not come up"; tail -5 "$OUT/$1.log"
}
probe() { # a greedy completion of fixed ids: its text
  curl -s localhost:$PORT/v1/completions -H 'Content-Type: application/json' \
    -d '{"model":"gpt-oss","prompt":[1000,2000,3000,4000,5000],"max_tokens":24,"temperature":0}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"].encode().hex())'
}
start_server serve_a
echo "== 1000 requests, a third hang up mid-stream ($((SECONDS - start)) s)"
timeout 300 $X bench --endpoint http://127.0.0.1:$PORT --requests 1000 --concurrency 64 \
  --input-len 512 --output-len 256 --vocab 201088 --disconnect 0.33 > "$OUT/disconnect.md" 2>&1
grep -E "completed|disconnected|output token|first error" "$OUT/disconnect.md" | tr '\n' ' '; echo
curl -s localhost:$PORT/metrics | grep -E "^xserv:(num_requests_(running|waiting)|kv_rows_in_use) "
after=$(probe)
echo "== 256 idle connections, then a request"
python3 - $PORT <<'PY' &
import socket, sys, time
socks = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(256)]
time.sleep(20)
PY
idle=$!
sleep 2
t0=$SECONDS
curl -s -m 15 localhost:$PORT/v1/completions -H 'Content-Type: application/json' \
  -d '{"model":"gpt-oss","prompt":[1,2,3],"max_tokens":8}' | head -c 160; echo
echo "request with 256 idle connections open: rc=$? in $((SECONDS - t0)) s"
kill $idle 2> /dev/null
kill -TERM $pid; wait $pid; echo "server exit code after SIGTERM: $?"
tail -1 "$OUT/serve_a.log"
start_server serve_b
fresh=$(probe)
[ "$after" = "$fresh" ] && echo "probe after the disconnects: the fresh server's tokens" ||
  echo "probe DIFFERS: $after vs $fresh"
kill -TERM $pid; wait $pid
echo "== done at $((SECONDS - start)) s"
