# Sourced by the device scripts (never run alone): the repository root as the working directory,
# the environment every call needs and the helpers the scripts share. What a script needs in
# .device/ (built here, carried) is in its header and in README.md; logs land in $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/../.." || exit 1
B=.device/bin X=.device/bin/xserv D=.device/data
# .device/old also holds the shared libraries an old binary needs that the machine lacks
# (libcpp-httplib and brotli for a server before Boost.Beast).
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:$PWD/$B:${LD_LIBRARY_PATH:-}:$PWD/.device/old
export XSERV_SOURCE_DIR=$PWD
export XSERV_KERNEL_CACHE=${XSERV_KERNEL_CACHE:-/tmp/xk} NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
start=$SECONDS

# Old against new in one call: OLD is the old binary (.device/old/xserv, carried), $X the new.
OLD=${OLD:-.device/old/xserv}
have_old() { [ -x "$OLD" ]; }
# bin_of old|new: the binary of a variant.
bin_of() { if [ "$1" = old ]; then echo "$OLD"; else echo "$X"; fi; }

# gpu_info: one line per GPU, and how many there are in $NGPU.
gpu_info() {
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  NGPU=$(nvidia-smi -L | grep -c '^GPU')
}

# at: seconds since the script started.
at() { echo "$((SECONDS - start)) s"; }

# run_tests BINARY [doctest options]: one GPU test binary of .device/bin into $OUT/BINARY.log
# within RUN_TIMEOUT seconds (300 by default); prints its exit code (124: the timeout), doctest's
# summary and the first failures. doctest's -tc patterns are case-insensitive and match anywhere
# only with a leading '*'.
run_tests() {
  local t=$1 log="$OUT/$1.log"
  shift
  timeout "${RUN_TIMEOUT:-300}" "$B/$t" "$@" > "$log" 2>&1
  echo "$t rc=$?: $(grep -E '^\[doctest\] (test cases|assertions)' "$log" | tr '\n' ' ')"
  grep -E "ERROR|FAILED" -A3 "$log" | head -30
}

# The 4 prompts (token ids) of the pipeline comparisons: 49, 98, 6 and 11 tokens.
PROMPTS=("$(seq -s, 1000 37 2800)" "$(seq -s, 7 3 300)" "200002,1,2,3,4,5" "$(seq -s, 50000 911 60000)")
# The 190-token prompt of the old-against-new token checks.
PROMPT190=$(seq -s, 1000 37 8000)

# synth20b [--reuse]: the synthetic 20b (seed 0) at /tmp/g20; --reuse keeps one already there.
synth20b() {
  [ "${1:-}" = --reuse ] && [ -f /tmp/g20/config.json ] && return 0
  rm -rf /tmp/g20
  $X synth --config $D/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
}

# compile_pair [flags]: /tmp/g20 compiled by the new binary into /tmp/p_new and, when there is
# an old one, by it into /tmp/p_old, in parallel (max-seq 8192, max-batch 64, then the flags).
compile_pair() {
  local v
  for v in new old; do
    [ $v = old ] && ! have_old && continue
    "$(bin_of $v)" compile /tmp/g20 -o /tmp/p_$v --max-seq 8192 --max-batch 64 "$@" \
      > /tmp/c_$v.log 2>&1 &
  done
  wait
  tail -1 /tmp/c_new.log
}

# rows LABEL BINARY PLAN [bench options]: the md rows of one `xserv bench` from the test column
# on (test, t/s, peak memory, and TTFT / TPOT for batched rows), each prefixed with LABEL.
rows() {
  local label=$1 bin=$2 plan=$3
  shift 3
  timeout "${BENCH_TIMEOUT:-200}" "$bin" bench "$plan" --backend cuda "$@" 2> /dev/null |
    grep -E '^\| ' | grep -vE '^\| model ' | cut -d'|' -f6- | sed "s/^/$label |/"
}

# tokens_equal A B: the greedy tokens of PROMPT190 from plans A and B (64 steps), compared;
# binaries from bin_of (A and B are old|new and the plans /tmp/p_A, /tmp/p_B).
tokens_equal() {
  local v
  for v in "$1" "$2"; do
    timeout 90 "$(bin_of $v)" run /tmp/p_$v --backend cuda --prompt-ids "$PROMPT190" \
      --max-tokens 64 > /tmp/tok_$v.txt 2> /dev/null
  done
  cmp -s /tmp/tok_$1.txt /tmp/tok_$2.txt && echo "greedy tokens $1 / $2: equal" ||
    echo "greedy tokens $1 / $2: DIFFER"
}

# serving_lines FILE: the headline figures of a serving report, on one line.
serving_lines() {
  grep -E "completed|failed|output token|TTFT (median|p99)|TPOT (median|p99)|ITL (median|p99)|host share|first error" \
    "$1" | cut -c1-90 | tr -s ' ' | tr '\n' ';'
  echo
}

# wait_health PORT PID SECONDS: until GET /health answers 200, the server dies, or time is up.
wait_health() {
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$3" ]; do
    curl -sf -m 2 "http://127.0.0.1:$1/health" > /dev/null && return 0
    kill -0 "$2" 2> /dev/null || { echo "server died"; return 1; }
    sleep 0.5
  done
  echo "no /health 200 after $3 s"
  return 1
}

# stop_server PID: SIGTERM, 20 s to drain and exit (its exit code printed), then SIGKILL.
stop_server() {
  local i
  kill -TERM "$1" 2> /dev/null
  for i in $(seq 40); do kill -0 "$1" 2> /dev/null || break; sleep 0.5; done
  kill -KILL "$1" 2> /dev/null
  wait "$1" 2> /dev/null
  echo "server exit code $?"
}
