#!/usr/bin/env bash
# Next call (not yet run: session 11 ran out of device time; 1 GPU, ~20 s warm): kernels_bench's MXFP4 down rows, FMA against the
# tensor-core prototype with its registers capped (4, 5, 6 blocks an SM). Needs
# .device/bin/kernels_bench.
source "$(dirname "$0")/common.sh"
timeout 100 $B/kernels_bench -tc="MXFP4 moe_down_part*" > /tmp/kb.log 2>&1
echo "kernels_bench rc=$?"; grep -E "mxfp4 down_part" /tmp/kb.log | sed 's/.*MESSAGE: //'
echo "done in $((SECONDS - start)) s"
