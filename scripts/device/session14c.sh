#!/usr/bin/env bash
# Session 14, call 3 (1 GPU, ~3 min): does the SM's L1 / shared-memory split move the decode
# step? 14a's MoE kernels take more shared memory (gate_up 32 -> 56 KB a block, down 32 -> 45),
# so the driver's per-launch carveout may now differ between neighbouring kernels, and an SM
# changes its split only once drained. Old (.device/old/xserv: e85ce67) against new with the
# driver's pick and with XSERV_SMEM_CARVEOUT (every kernel the same preference), two rounds; then
# batch 8. XSERV_SMEM_CARVEOUT was a runtime knob built for this call alone and removed after it
# (forcing one carveout lost 2% at tg128 and B8). Needs .device/bin/xserv, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
row() { # row LABEL BINARY PLAN [env...]
  local label=$1 bin=$2 plan=$3
  shift 3
  echo "-- $label: $(env "$@" timeout 100 $bin bench $plan --backend cuda -p 0 -n 128 -b 1 \
    -d 0,4096 -r 2 2> /dev/null | grep -E "tg" | cut -d'|' -f6,7 | tr '\n' ' ')"
}
for round in 1 2; do
  row old "$OLD" /tmp/p_old
  row new $X /tmp/p_new
  row "new carveout 100" $X /tmp/p_new XSERV_SMEM_CARVEOUT=100
  row "new carveout 86" $X /tmp/p_new XSERV_SMEM_CARVEOUT=86
  row "old carveout 100" "$OLD" /tmp/p_old XSERV_SMEM_CARVEOUT=100
done
for c in "" 100; do
  echo "-- new B8 carveout '$c': $(XSERV_SMEM_CARVEOUT=$c timeout 100 $X bench /tmp/p_new \
    --backend cuda -p 0 -n 128 -b 8 -r 2 2> /dev/null | grep -E "tg" | cut -d'|' -f6,7)"
done
echo "done in $((SECONDS - start)) s"
