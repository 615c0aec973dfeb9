#!/usr/bin/env bash
# Serving at scale, the paged KV pool's workloads, in one call (nvidia-h200, ~7 min): the default
# plan (no --max-batch: 256 rows of decode graphs, KV from the pool) behind `xserv serve`, driven
# over HTTP by `xserv bench --endpoint` (streaming completions):
#   c64 256 x (512 + 256); c256 and c512 1,024 x (512 + 256) (preemptions from /metrics);
#   a 2,048-token shared prefix + 64 unique, 128 out, at c64 and c1, with the prefix cache and
#   again on a server started with --no-prefix-cache; an 8-turn chat replayed turn by turn
#   (TTFT by turn); then the decode aggregate at depth 512 for B64, B128, B256. Not in the
#   default set: long (512 requests of 1,024 + 1,024 at c256 and c512, issue 35's moonshot
#   workload, ~2 min).
#   KV_DTYPE=bf16   compile the plan with --kv-dtype bf16 instead of the default
#   SERVE_FLAGS=... flags for both servers (--prefill-budget N, --backlog-steps N,
#                   --itl-target MS, ...)
#   PARTS="..."     a subset of: c64 c256 c512 prefix turns nocache decode long (default all
#                   but long)
# With an old binary (.device/old/xserv, carried; OLD= another path) of a fixed-slot engine: its
# c64 over HTTP first (a --max-seq 8192 --max-batch 64 plan, --max-running 64) and its decode
# aggregate on a --max-seq 2304 --max-batch 256 plan, the baselines of the same call.
# OLD_PLAN=default (an old binary with the paged pool): the old binary instead runs the same
# PARTS c64 c256 c512 on its own default plan first (old_c64, ...), then the new one.
# Needs .device/bin/xserv, .device/data/{gpt-oss-20b.json,o200k_base.tiktoken};
# carry [".device/bin", ".device/data"].
source "$(dirname "$0")/common.sh"
gpu_info
synth20b
PLAN=/tmp/pd
# shellcheck disable=SC2086
$X compile /tmp/g20 -o $PLAN ${KV_DTYPE:+--kv-dtype $KV_DTYPE} 2>&1 | tail -1
PORT=8322
PARTS=${PARTS:-"c64 c256 c512 prefix turns nocache decode"}
want() { [[ " $PARTS " == *" $1 "* ]]; }

# start_server LOG [flags]: `xserv serve` on PORT in the background, its pid in $pid.
start_server() {
  local log=$1
  shift
  # shellcheck disable=SC2086
  $X serve $PLAN --port $PORT --tokenizer $D/o200k_base.tiktoken ${SERVE_FLAGS:-} "$@" \
    > "$OUT/$log" 2>&1 &
  pid=$!
  wait_health $PORT $pid 150 || { tail -5 "$OUT/$log"; exit 1; }
  grep -E "KV|pool" "$OUT/$log" | head -3
}
# load NAME TIMEOUT [bench flags]: one `xserv bench --endpoint` run into $OUT/NAME.md.
load() {
  local name=$1 t=$2
  shift 2
  echo "== $name ($(at))"
  timeout "$t" $X bench --endpoint http://127.0.0.1:$PORT "$@" > "/tmp/$name.md" 2>&1
  serving_lines "/tmp/$name.md"
  grep -E "TTFT of turn" "/tmp/$name.md" | tr -s ' ' | tr '\n' ';'
  echo
}
metrics() {
  curl -s localhost:$PORT/metrics |
    grep -E "^xserv:(num_preemptions_total|prefix_cache_(queries|hits)_total|kv_blocks_total|num_requests_running) " |
    tr '\n' ' '
  echo
}
W="--input-len 512 --output-len 256"
P="--shared-prefix 2048 --input-len 64 --output-len 128"
if have_old && [ "${OLD_PLAN:-}" = default ]; then
  $OLD compile /tmp/g20 -o /tmp/p_old ${KV_DTYPE:+--kv-dtype $KV_DTYPE} 2>&1 | tail -1
  # shellcheck disable=SC2086
  $OLD serve /tmp/p_old --port $PORT --tokenizer $D/o200k_base.tiktoken ${SERVE_FLAGS:-} \
    > "$OUT/serve_old.log" 2>&1 &
  pid=$!
  if wait_health $PORT $pid 150; then
    want c64 && load old_c64 120 --requests 256 --concurrency 64 $W
    want c256 && load old_c256 150 --requests 1024 --concurrency 256 $W && metrics
    want c512 && load old_c512 150 --requests 1024 --concurrency 512 $W && metrics
  fi
  stop_server $pid
elif have_old; then
  $OLD compile /tmp/g20 -o /tmp/p_old64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
  $OLD serve /tmp/p_old64 --port $PORT --tokenizer $D/o200k_base.tiktoken --max-running 64 \
    > "$OUT/serve_old.log" 2>&1 &
  pid=$!
  wait_health $PORT $pid 150 && want c64 && load old_c64 120 --requests 256 --concurrency 64 $W
  stop_server $pid
  if want decode; then
    $OLD compile /tmp/g20 -o /tmp/p_old256 --max-seq 2304 --max-batch 256 2>&1 | tail -1
    rows old256 $OLD /tmp/p_old256 -p 0 -n 128 -d 512 -b 64,128,256 -r 2
  fi
fi
start_server serve.log
want c64 && load c64 120 --requests 256 --concurrency 64 $W
want c256 && load c256 150 --requests 1024 --concurrency 256 $W && metrics
want c512 && load c512 150 --requests 1024 --concurrency 512 $W && metrics
want long && load long_c256 200 --requests 512 --concurrency 256 --input-len 1024 \
  --output-len 1024 && metrics
want long && load long_c512 200 --requests 512 --concurrency 512 --input-len 1024 \
  --output-len 1024 && metrics
want prefix && load prefix_c64 90 --requests 256 --concurrency 64 $P && metrics
want prefix && load prefix_c1 60 --requests 16 --concurrency 1 $P --seed 7
want turns && load turns8 120 --requests 64 --turns 8 --concurrency 8 --input-len 256 \
  --output-len 128 --seed 11
stop_server $pid
if want nocache; then
  start_server serve_nocache.log --no-prefix-cache
  load nocache_prefix_c64 90 --requests 256 --concurrency 64 $P
  load nocache_prefix_c1 60 --requests 16 --concurrency 1 $P --seed 7
  load nocache_turns8 120 --requests 64 --turns 8 --concurrency 8 --input-len 256 \
    --output-len 128 --seed 11
  stop_server $pid
fi
if want decode; then
  echo "== decode aggregate at depth 512 ($(at))"
  rows pd $X $PLAN -p 0 -n 128 -d 512 -b 64,128,256 -r 2
fi
echo "== done at $(at)"
