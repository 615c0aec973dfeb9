#!/usr/bin/env bash
# Session 17, call 4 (1 GPU, ~5 min): the shared-memory copies of qkv (17b) and o_proj (session
# 15) throttled to a few rows or pieces in flight a block, so that the DRAM queues stay short
# for the small kernel they overlap (moe_combine, attention_combine), with compile-time knobs of
# an experimental patch: XSERV_EXP_QKV_INFLIGHT=N (rows of 5,760 bytes in flight a qkv block;
# 40 = all at once, 17b), XSERV_EXP_OPROJ_INFLIGHT=F (pieces of 24 KB of 8; 8 = all),
# XSERV_EXP_NO_QKV_SMEM (the streaming qkv). Batch-1 rows of each plan, old (6d3ca8a) first and
# last; timelines of two. Needs .device/bin/xserv, .device/old/xserv.
source "$(dirname "$0")/common.sh"
synth20b
declare -A KNOBS=([q40]="" [q4]="XSERV_EXP_QKV_INFLIGHT=4" [q8]="XSERV_EXP_QKV_INFLIGHT=8"
  [q16]="XSERV_EXP_QKV_INFLIGHT=16" [o2]="XSERV_EXP_NO_QKV_SMEM=1 XSERV_EXP_OPROJ_INFLIGHT=2"
  [o4]="XSERV_EXP_NO_QKV_SMEM=1 XSERV_EXP_OPROJ_INFLIGHT=4" [o8]="XSERV_EXP_NO_QKV_SMEM=1"
  [q8o2]="XSERV_EXP_QKV_INFLIGHT=8 XSERV_EXP_OPROJ_INFLIGHT=2")
VARIANTS="q40 q4 q8 q16 o8 o2 o4 q8o2"
variant_sweep KNOBS "$VARIANTS" "q8 q8o2" q8
echo "done in $((SECONDS - start)) s"
