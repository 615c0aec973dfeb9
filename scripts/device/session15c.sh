#!/usr/bin/env bash
# Session 15, call 1 (1 GPU, ~6 min): o_proj's one-token kernel with its rows resident in shared
# memory (linear_decode_smem: the bulk-copy engine streams each block's 192 KiB of W as the
# block starts, during decode attention), first its GPU test, then old (b086909) against new,
# then the first run of a timeline plan (session15b.sh's checks) on the new binary. Needs
# .device/bin/{xserv,codegen_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
RUN_TIMEOUT=60 run_tests codegen_gpu_tests -tc="linear_decode_smem*,linear kernels match*"
grep -E "linear_decode_smem k|smem_r" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | head -12
synth20b
ab_compile
$X compile /tmp/g20 -o /tmp/p_tl --max-seq 8192 --max-batch 64 --timeline > /tmp/c_tl.log 2>&1
echo "new plan's o_proj: $(grep -rhoa 'linear_residual_k4096_n2880_t1[a-z0-9_]*' /tmp/p_new | sort -u | tr '\n' ' ')"
ab_tokens 64
ab_decode 2
ab_batch 8
$X inspect /tmp/p_tl | grep -iE "timeline|launches" | head -3
for args in "-b 1 -d 0" "-b 1 -d 4096" "-b 8 -d 0"; do
  echo "== timeline $args"
  timeout 100 $X bench /tmp/p_tl --backend cuda -p 0 -n 128 $args -r 1 2> "$OUT/tl.log" |
    grep -E "tg" | cut -d'|' -f6,7
  grep -E "^\[timeline\]" "$OUT/tl.log" | head -20
  cp "$OUT/tl.log" "$OUT/tl_${args// /}.log"
done
echo "done in $((SECONDS - start)) s"
