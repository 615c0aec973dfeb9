#!/usr/bin/env bash
# One short call on nvidia-h200-x2: the NCCL and CUDA-pipeline GPU tests, then the synthetic 20b
# with --pp 2 as two processes on two GPUs against --pp 1: greedy tokens and bench rows. Needs
# .device/bin/{xserv,cli_gpu_tests,runtime_gpu_tests} and .device/data/gpt-oss-20b.json (carry
# [".device/bin", ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
run_tests runtime_gpu_tests -tc="*NCCL*"
run_tests cli_gpu_tests -tc="gpu: pp 2*"
grep -hE "MESSAGE" -A1 "$OUT"/*_gpu_tests.log | head -12
$X synth --config .device/data/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
for pp in 1 2; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
done
prompts=("$(seq -s, 1000 37 2800)" "$(seq -s, 50000 911 60000)")
for i in "${!prompts[@]}"; do
  for pp in 1 2; do
    timeout 120 $X run /tmp/pp$pp --backend cuda --prompt-ids "${prompts[$i]}" --max-tokens 64 \
      > "$OUT/pp${pp}_p$i.txt" 2> "$OUT/pp${pp}_p$i.err"
    echo "pp$pp prompt $i rc=$? $(grep -E '^\[run\]' "$OUT/pp${pp}_p$i.err" | tail -1)"
  done
  cmp -s "$OUT/pp1_p$i.txt" "$OUT/pp2_p$i.txt" && echo "prompt $i: pp2 gives pp1's 64 tokens" \
    || echo "prompt $i: pp2 DIFFERS from pp1"
done
echo "== bench pp2 (two processes, two GPUs, activations and logits over TCP)"
timeout 150 $X bench /tmp/pp2 --backend cuda -p 512 -n 32 -b 1,32 -r 2 2> "$OUT/benchpp2.err" | tail -3
echo "== done at $((SECONDS - start)) s"
