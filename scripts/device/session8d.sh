#!/usr/bin/env bash
# Session 8 (1 GPU, ~7 min): gemm_wg's pipeline variants (stages of 2 K tiles, MMAs left in
# flight) against ir::ref and in kernels_bench, then the synthetic 20b against HF transformers
# with split (fp32-grade) and plain bf16 gemm activations (hf20b.sh's reference and test).
# Needs .device/bin/{codegen_gpu_tests,kernels_bench,cli_gpu_tests}, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*gemm_wg*"
grep -E "rel L2" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | grep -E "ks|pipe" | head -30
echo "== gemm throughput ($((SECONDS - start)) s)"
timeout 300 $B/kernels_bench -tc="gemm throughput*" > "$OUT/bench.log" 2>&1
echo "kernels_bench rc=$?"
grep -E "ERROR" -A3 "$OUT/bench.log" | head
grep -E "MESSAGE: gemm" "$OUT/bench.log" | sed 's/.*MESSAGE: gemm //' | grep -v "^moe gate_up\|^moe down"
echo "== HF ($((SECONDS - start)) s)"
synth20b
timeout 240 python3 tools/hf_20b_reference.py /tmp/g20 --ids-seed 0 --tokens 256 --greedy 64 \
  --out /tmp/ref > "$OUT/hf_ref.log" 2>&1
echo "HF reference rc=$? at $((SECONDS - start)) s"
for prec in split bf16; do
  XSERV_GEMM_PRECISION=$prec XSERV_20B_CKPT=/tmp/g20 XSERV_20B_REF=/tmp/ref timeout 150 \
    $B/cli_gpu_tests -tc="gpu: synthetic 20b*" > "$OUT/hf20b_$prec.log" 2>&1
  echo "-- $prec rc=$?"
  grep -E "MESSAGE|ERROR" -A1 "$OUT/hf20b_$prec.log" | grep -E "20b|ERROR|positions" | head -6
done
echo "done in $((SECONDS - start)) s"
