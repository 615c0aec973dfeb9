#!/usr/bin/env bash
# Session 14, call 4 (1 GPU, ~3 min): 14a's in-graph costs (XSERV_PROFILE_REPEAT) had the new
# gate_up 1.2 us a layer cheaper than session 13's and the new down 1.0 us dearer, across
# sessions. Here old (.device/old/xserv: e85ce67) and new in one call, two runs each, for the
# kernels 14a changed, so that the step's missing gain is placed. Needs .device/bin/xserv,
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
rep() { # rep VARIANT KERNEL
  local bin rep=$2
  bin=$(bin_of "$1")
  [ "$2" = none ] && rep=
  echo "-- $1 x2 $2: $(XSERV_PROFILE_REPEAT=$rep timeout 100 $bin bench /tmp/p_$1 --backend cuda \
    -p 0 -n 128 -b 1 -r 2 2> /dev/null | grep -E "tg" | cut -d'|' -f6,7 | tr '\n' ' ')"
}
for round in 1 2; do
  for k in none moe_gate_up moe_down_part rmsnorm_router_topk; do
    rep old $k
    rep new $k
  done
done
echo "done in $((SECONDS - start)) s"
