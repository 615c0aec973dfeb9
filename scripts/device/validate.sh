#!/usr/bin/env bash
# A session's first (or closing) call (nvidia-h200-x2, about 6 minutes): x2.sh (every GPU test,
# the 20b bench rows, pp 2 against pp 1, pp 2 over TCP and NCCL; TRANSPORTS=nccl skips TCP) then
# hf20b.sh (the 20b against HF transformers): the whole GPU-side check in one machine start.
# Carry [".device/bin", ".device/data"]; logs land in $OUT.
set -uo pipefail
here="$(dirname "$0")"
bash "$here/x2.sh"
echo "== hf20b"
bash "$here/hf20b.sh" 2>&1 | tail -8
