#!/usr/bin/env bash
# One device call: GPU tests (TESTS), then the synthetic 20b's bench rows of the TARGETS table
# (plan --max-seq 8192 --max-batch 64), and the decode rows again with XSERV_PDL=0 for an A/B of
# programmatic dependent launch. Needs .device/bin/{xserv,*_gpu_tests} and
# .device/data/gpt-oss-20b.json (carry [".device/bin", ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
for t in ${TESTS-codegen_gpu_tests cli_gpu_tests}; do
  run_tests $t
done
echo "== tests done at $((SECONDS - start)) s"
$X synth --config .device/data/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
timeout 240 $X bench /tmp/p64 --backend cuda ${BENCH:--p 512,2048 -n 128 -b 1,64 -r 3} 2> "$OUT/bench.err"
tail -2 "$OUT/bench.err"
timeout 120 $X bench /tmp/p64 --backend cuda -p 0 -n 128 -d 4096 -r 2 2> /dev/null | tail -1
if [ -n "${AB:-1}" ]; then
  echo "== XSERV_PDL=0"
  XSERV_PDL=0 timeout 120 $X bench /tmp/p64 --backend cuda -p 0 -n 128 -b 1,64 -r 2 2> /dev/null | tail -2
fi
if [ -n "${PROFILE:-}" ]; then
  echo "== profile (XSERV_PROFILE=1, graphs off)"
  XSERV_PROFILE=1 timeout 120 $X bench /tmp/p64 --backend cuda -p 512 -n 16 -b 1,64 -r 1 \
    2>&1 >/dev/null | grep "^\[profile\]"
fi
echo "== done at $((SECONDS - start)) s"
