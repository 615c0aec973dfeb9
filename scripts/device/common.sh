# Sourced by the device scripts (never run alone): the repository root as the working directory,
# the environment every call needs, and run_tests. Each script documents what it needs in
# .device/ (built here and carried with [".device/bin", ".device/data"]); logs land in $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/../.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XSERV_SOURCE_DIR=$PWD
export XSERV_KERNEL_CACHE=${XSERV_KERNEL_CACHE:-/tmp/xk} NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.device/bin X=.device/bin/xserv D=.device/data
start=$SECONDS

# run_tests BINARY [doctest options]: runs one GPU test binary of .device/bin into
# $OUT/BINARY.log and prints its exit code, doctest's summary and the first failures.
run_tests() {
  local t=$1
  shift
  timeout 300 "$B/$t" "$@" > "$OUT/$t.log" 2>&1
  echo "$t rc=$?: $(grep -E '^\[doctest\] (test cases|assertions)' "$OUT/$t.log" | tr '\n' ' ')"
  grep -E "ERROR|FAILED" -A3 "$OUT/$t.log" | head -30
}

# The 4 prompts (token ids) every pp N against pp 1 comparison runs: 49, 98, 6 and 11 tokens.
PROMPTS=("$(seq -s, 1000 37 2800)" "$(seq -s, 7 3 300)" "200002,1,2,3,4,5" "$(seq -s, 50000 911 60000)")

# synth20b [--reuse]: the synthetic 20b (seed 0) at /tmp/g20; --reuse keeps one already there.
synth20b() {
  [ "${1:-}" = --reuse ] && [ -d /tmp/g20 ] && return 0
  $X synth --config $D/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
}

