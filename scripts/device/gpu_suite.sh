#!/usr/bin/env bash
# The GPU test suite in one call (nvidia-h200; the cases that need two GPUs skip on one): every
# .device/bin/*_gpu_tests binary except the exhaustive variant sweeps (*_sweep_gpu_tests, ctest
# label gpu-sweep), each under a timeout, then a summary table. Binaries are globbed, not named.
#   SUITE=default (the above) | sweep (only the *_sweep_gpu_tests) | all (both)
#   TESTS="engine cli"   only the binaries whose names start with these words
#   TEST_ARGS="..."      doctest options for every binary (e.g. -tc="*attention*")
#   SHARDS=6 JOBS=6      shards a binary, shards at once
#   RUN_TIMEOUT=420      seconds a shard (the call has 600 in all: the sweeps want a call of
#                        their own with a larger one)
#   WITH_20B=1           synthesize the 20b first and set XSERV_20B_CKPT, so that the cases
#                        that take it (the engine's batch invariance on the 20b) run too
# Needs .device/bin/*_gpu_tests (and xserv with WITH_20B=1),
# .device/data; carry [".device/bin", ".device/data"]. Logs of the shards not ok land in $OUT.
source "$(dirname "$0")/common.sh"
gpu_info
echo "$NGPU GPU(s)"
if [ "${WITH_20B:-0}" = 1 ]; then
  synth20b
  export XSERV_20B_CKPT=/tmp/g20
fi
bins=()
for f in "$B"/*_gpu_tests; do
  [ -x "$f" ] || continue
  name=$(basename "$f")
  sweep=0
  [[ $name == *_sweep_gpu_tests ]] && sweep=1
  case ${SUITE:-default} in
    default) [ $sweep = 0 ] || continue ;;
    sweep) [ $sweep = 1 ] || continue ;;
    all) ;;
    *) echo "SUITE is default, sweep or all"; exit 2 ;;
  esac
  if [ -n "${TESTS:-}" ]; then
    keep=0
    for w in $TESTS; do [[ $name == "$w"* ]] && keep=1; done
    [ $keep = 1 ] || continue
  fi
  bins+=("$name")
done
[ ${#bins[@]} -gt 0 ] || { echo "no test binaries matched in $B"; exit 1; }
echo "== ${#bins[@]} binaries: ${bins[*]}"
# counts WHAT LOG: doctest's "WHAT: n | n passed | n failed" line as "n, n passed, n failed".
counts() {
  grep -E "^\[doctest\] $1" "$2" | tail -1 | sed -E "s/^\[doctest\] $1: *//; s/ *\| */, /g" |
    tr -s ' ' | sed -E 's/, *$//'
}
# Each binary's test cases in SHARDS ranges (doctest --first/--last over its filtered count),
# JOBS shards at once: NVRTC compiles dominate most cases, and the GPU has room for several.
SHARDS=${SHARDS:-6}
JOBS=${JOBS:-6}
shards=()
for t in "${bins[@]}"; do
  # shellcheck disable=SC2086
  n=$("$B/$t" ${TEST_ARGS:-} --count 2> /dev/null | grep -oE '[0-9]+$' | tail -1)
  n=${n:-0}
  k=$SHARDS
  [ "$n" -lt "$k" ] && k=$((n > 0 ? n : 1))
  for ((i = 0; i < k; i++)); do
    shards+=("$t $((i * n / k + 1)) $(((i + 1) * n / k)) $n $((i + 1))/$k")
  done
done
# run_shard BINARY FIRST LAST COUNT TAG: one range under RUN_TIMEOUT; its row in $OUT/TAG.row.
run_shard() {
  local t=$1 first=$2 last=$3 n=$4 tag=$5 t0=$SECONDS rc status
  local log="/tmp/suite/$t.${tag%/*}.log"
  # shellcheck disable=SC2086
  timeout "${RUN_TIMEOUT:-420}" "$B/$t" ${TEST_ARGS:-} --first="$first" --last="$last" \
    > "$log" 2>&1
  rc=$?
  status=ok
  [ $rc = 124 ] && status="TIMEOUT after ${RUN_TIMEOUT:-420} s"
  [ $rc != 0 ] && [ $rc != 124 ] && status="FAILED (rc $rc)"
  # doctest's test-case line counts the whole filtered set, not the range: the range instead.
  echo "| $t [$tag] | $status | $first-$last of $n | $(counts assertions "$log") |" \
    "$((SECONDS - t0)) |" > "$log.row"
  echo "== $t [$tag]: $status in $((SECONDS - t0)) s"
  grep -E "ERROR|FAILED" -A3 "$log" | head -20
}
rm -rf /tmp/suite && mkdir -p /tmp/suite
for s in "${shards[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
  # shellcheck disable=SC2086
  run_shard $s &
done
wait
summary=()
fails=0
for f in /tmp/suite/*.log.row; do
  summary+=("$(cat "$f")")
  grep -q '| ok |' "$f" && continue
  fails=$((fails + 1))
  cp "${f%.row}" "$OUT/" # the logs of shards not ok come back (8 files at most)
done
echo
echo "| binary [shard] | result | test cases | assertions | s |"
echo "|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
echo "== $fails of ${#shards[@]} shards not ok; total $(at)"
[ $fails = 0 ]
