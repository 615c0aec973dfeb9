#!/usr/bin/env bash
# The next session's first call (nvidia-h200-x2, about 7 minutes): x2.sh (every GPU test, the
# 20b bench rows, pp 2 over TCP and NCCL) then hf20b.sh (the 20b against HF transformers), so the
# code written after session 3's last device call is checked in one machine start.
# Carry [".device/bin", ".device/data"]; logs land in $OUT.
set -uo pipefail
here="$(dirname "$0")"
bash "$here/x2.sh"
echo "== hf20b"
bash "$here/hf20b.sh" 2>&1 | tail -8
