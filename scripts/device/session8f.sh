#!/usr/bin/env bash
# Session 8, the last call (1 GPU, ~4.5 min): after merging issue 15's moves, issue 18's
# hardening and the warpgroup-MMA gemms with the new defaults (mxfp4 experts, plain bf16 gemm
# activations): the engine, cli and runtime GPU tests (batch invariance in both precisions among
# them), a tiny pp 2 plan with its IR deleted over --pp-local against pp 1, then the synthetic
# 20b's bench rows of the binary before the gemms (.device/old/xserv) against the new one, and the
# 20b's batch invariance in both precisions if time is left. Summary in $OUT/summary.txt.
source "$(dirname "$0")/common.sh"
S=$OUT/summary.txt
{
run_tests engine_gpu_tests
run_tests cli_gpu_tests
run_tests runtime_gpu_tests
grep -h "batch invariance" "$OUT/engine_gpu_tests.log" | sed 's/.*MESSAGE: //'
T=/tmp/f8 && rm -rf $T && mkdir -p $T
$X synth --config examples/tiny/config.json -o $T/m --seed 3 2>&1 | tail -1
ids=$(seq -s, 1000 37 2443)
$X compile $T/m -o $T/pp1 --max-batch 4 --max-seq 512 > /dev/null 2>&1
$X compile $T/m -o $T/pp2 --max-batch 4 --max-seq 512 --pp 2 > /dev/null 2>&1
rm -f $T/pp1/*.ir $T/pp2/*.ir
timeout 60 $X run $T/pp1 --backend cuda --prompt-ids $ids --max-tokens 16 > $T/a 2> $OUT/pp1.err
timeout 60 $X run $T/pp2 --backend cuda --prompt-ids $ids --max-tokens 16 --pp-local > $T/b \
  2> $OUT/pp2.err
cmp -s $T/a $T/b && echo "pp2 --pp-local == pp1 (IR deleted): $(head -c 60 $T/a)" ||
  echo "pp2 DIFFERS: $(head -c 60 $T/a) | $(head -c 60 $T/b)"
echo "== 20b at $((SECONDS - start)) s"
synth20b
.device/old/xserv compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > /dev/null 2>&1 &
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > "$OUT/c_new.log" 2>&1 &
wait
rm -f /tmp/p_new/graph.ir
for v in new old; do
  bin=$X plan=/tmp/p_new
  [ "$v" = old ] && bin=.device/old/xserv plan=/tmp/p_old
  echo "-- $v"
  timeout 100 $bin bench $plan --backend cuda -p 512,2048 -n 128 -b 1,64 -r 1 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 60 $bin bench $plan --backend cuda -p 0 -n 128 -d 4096 -r 1 2> /dev/null |
    grep -E "tg" | cut -d'|' -f6,7
done
echo "== invariance at $((SECONDS - start)) s"
if [ $((SECONDS - start)) -lt 190 ]; then
  XSERV_20B_CKPT=/tmp/g20 timeout 120 $B/engine_gpu_tests -tc="*batch invariance on the 20b*" \
    > "$OUT/inv20b.log" 2>&1
  echo "rc=$?"; grep -h "batch invariance\|ERROR" -A1 "$OUT/inv20b.log" | sed 's/.*MESSAGE: //' | head -6
fi
echo "done in $((SECONDS - start)) s"
} 2>&1 | tee "$S"
