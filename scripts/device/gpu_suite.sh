#!/usr/bin/env bash
# The GPU test suite in one call (nvidia-h200; the cases that need two GPUs skip on one): every
# .device/bin/*_gpu_tests binary except the exhaustive variant sweeps (*_sweep_gpu_tests, ctest
# label gpu-sweep), each under a timeout, then a summary table. Binaries are globbed, not named.
#   SUITE=default (the above) | sweep (only the *_sweep_gpu_tests) | all (both)
#   TESTS="engine cli"   only the binaries whose names start with these words
#   TEST_ARGS="..."      doctest options for every binary (e.g. -tc="*attention*")
#   RUN_TIMEOUT=300      seconds a binary (the call has 600 in all: the sweeps want a call of
#                        their own with a larger one)
#   WITH_20B=1           synthesize the 20b first and set XSERV_20B_CKPT, so that the cases
#                        that take it (the engine's batch invariance on the 20b) run too
# Needs .device/bin/{*_gpu_tests, libcpp-httplib.so.0.11} (and xserv with WITH_20B=1),
# .device/data; carry [".device/bin", ".device/data"]. Logs land in $OUT (one per binary).
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
summary=()
fails=0
for t in "${bins[@]}"; do
  t0=$SECONDS
  # shellcheck disable=SC2086
  timeout "${RUN_TIMEOUT:-300}" "$B/$t" ${TEST_ARGS:-} > "$OUT/$t.log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  cases=$(counts "test cases" "$OUT/$t.log")
  asserts=$(counts assertions "$OUT/$t.log")
  status=ok
  [ $rc = 124 ] && status="TIMEOUT after ${RUN_TIMEOUT:-300} s"
  [ $rc != 0 ] && [ $rc != 124 ] && status="FAILED (rc $rc)"
  [ $rc = 0 ] || fails=$((fails + 1))
  echo "== $t: $status in $secs s"
  grep -E "ERROR|FAILED" -A3 "$OUT/$t.log" | head -20
  summary+=("| $t | $status | ${cases:--} | ${asserts:--} | $secs |")
done
echo
echo "| binary | result | test cases | assertions | s |"
echo "|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
echo "== $fails of ${#bins[@]} binaries not ok; total $(at)"
[ $fails = 0 ]
