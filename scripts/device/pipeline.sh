#!/usr/bin/env bash
# One device call: the GPU test binaries (TESTS, default all three), then the full-size synthetic
# 20b through the same-device pipeline: PP=1 against --pp 2 and --pp 4 with --pp-local, greedy
# tokens on 4 prompts. Needs .device/bin/{xserv,*_gpu_tests} and .device/data/gpt-oss-20b.json
# (carry [".device/bin", ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
for t in ${TESTS-runtime_gpu_tests codegen_gpu_tests cli_gpu_tests}; do
  run_tests $t
done
echo "== tests done at $((SECONDS - start)) s"
$X synth --config .device/data/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
for pp in ${PPS:-1 2 4}; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
done
prompts=("$(seq -s, 1000 37 2800)" "$(seq -s, 7 3 300)" "200002,1,2,3,4,5" "$(seq -s, 50000 911 60000)")
for pp in ${PPS:-1 2 4}; do
  local_flag=""; [ "$pp" -gt 1 ] && local_flag="--pp-local"
  for i in "${!prompts[@]}"; do
    timeout 120 $X run /tmp/pp$pp --backend cuda $local_flag --prompt-ids "${prompts[$i]}" \
      --max-tokens ${STEPS:-64} > "$OUT/pp${pp}_p$i.txt" 2> "$OUT/pp${pp}_p$i.err"
    echo "pp$pp prompt $i rc=$? $(grep -E '^\[run\]' "$OUT/pp${pp}_p$i.err" | tail -1)"
  done
done
for pp in ${PPS:-1 2 4}; do
  [ "$pp" -eq 1 ] && continue
  for i in "${!prompts[@]}"; do
    if cmp -s "$OUT/pp1_p$i.txt" "$OUT/pp${pp}_p$i.txt"; then echo "pp$pp prompt $i: same tokens as pp1"
    else echo "pp$pp prompt $i: DIFFERS from pp1"; fi
  done
done
echo "== done at $((SECONDS - start)) s"
