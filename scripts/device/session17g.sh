#!/usr/bin/env bash
# Session 17, call 7 (1 GPU, ~1.5 min): session17f.sh again, on a binary whose waiting down parts
# poll with a 64 ns backoff and keep each slot's counters on their own 128-byte line (the same
# experimental patch, XSERV_EXP_FUSED_MOE, not kept).
exec bash "$(dirname "$0")/session17f.sh"
