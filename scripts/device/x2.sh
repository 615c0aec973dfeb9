#!/usr/bin/env bash
# One call on nvidia-h200-x2: every GPU test (the pipeline and NCCL cases use both GPUs), the
# synthetic 20b's bench rows on GPU 0, then the 20b with --pp 2 as two processes on two GPUs
# against --pp 1 (greedy tokens and every step's logits, 4 prompts; pp_exact.sh: which rows
# are bitwise with whole prompt steps, and pp 4 on one GPU) and its prefill /
# batched-decode speed with the activations over TCP and over NCCL (TRANSPORTS). Needs
# .device/bin/{xserv,*_gpu_tests} and .device/data/gpt-oss-20b.json (carry [".device/bin",
# ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for t in ${TESTS-codegen_gpu_tests cli_gpu_tests runtime_gpu_tests}; do
  run_tests $t ${TEST_ARGS:-}
done
grep -hE "GB/s|TB/s|us per|pp 2 over|missing sender|bitwise" "$OUT"/*_gpu_tests.log | head -30
echo "== tests done at $((SECONDS - start)) s"
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
CUDA_VISIBLE_DEVICES=0 timeout 240 $X bench /tmp/p64 --backend cuda -p 512,2048 -n 128 -b 1,64 -r 3 2> "$OUT/bench.err"
tail -1 "$OUT/bench.err"
CUDA_VISIBLE_DEVICES=0 timeout 120 $X bench /tmp/p64 --backend cuda -p 0 -n 128 -d 4096 -r 2 2> /dev/null | tail -1
echo "== bench done at $((SECONDS - start)) s"
for pp in 1 2; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
done
prompts=("${PROMPTS[@]}")
for pp in 1 2; do
  for i in "${!prompts[@]}"; do
    timeout 120 $X run /tmp/pp$pp --backend cuda --prompt-ids "${prompts[$i]}" --max-tokens 64 \
      --logits-out /tmp/logits_pp${pp}_p$i.f32 > "$OUT/pp${pp}_p$i.txt" 2> "$OUT/pp${pp}_p$i.err"
    echo "pp$pp prompt $i rc=$? $(grep -E '^\[run\]' "$OUT/pp${pp}_p$i.err" | tail -1)"
  done
done
for i in "${!prompts[@]}"; do
  cmp -s "$OUT/pp1_p$i.txt" "$OUT/pp2_p$i.txt" && echo "pp2 prompt $i: same 64 tokens as pp1" \
    || echo "pp2 prompt $i: DIFFERS from pp1"
done
python3 scripts/device/compare_logits.py /tmp pp1 pp2 4 # every step, 4 prompts x 64 steps
REUSE_PP1=1 bash scripts/device/pp_exact.sh # whole prompt steps: which rows are bitwise
grep -h "pipeline\]" "$OUT/pp2_p0.err" | head -3
echo "== bench pp1"
timeout 150 $X bench /tmp/pp1 --backend cuda -p 512 -n 32 -b 1,32 -r 2 2> /dev/null | tail -3
for transport in ${TRANSPORTS:-tcp nccl}; do # pp2: two processes on two GPUs, micro-batched steps
  echo "== bench pp2, activations over $transport"
  XSERV_PIPELINE_TRANSPORT=$transport timeout 150 $X bench /tmp/pp2 --backend cuda -p 512 -n 32 \
    -b 1,32 -r 2 2> "$OUT/benchpp2_$transport.err" | tail -3
  XSERV_PIPELINE_TRANSPORT=$transport timeout 120 $X run /tmp/pp2 --backend cuda \
    --prompt-ids "${prompts[0]}" --max-tokens 64 > "$OUT/pp2_$transport.txt" 2> /dev/null
  cmp -s "$OUT/pp1_p0.txt" "$OUT/pp2_$transport.txt" && echo "pp2 over $transport: pp1's tokens" \
    || echo "pp2 over $transport: DIFFERS from pp1"
done
echo "== done at $((SECONDS - start)) s"
