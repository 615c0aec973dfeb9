#!/usr/bin/env bash
# Packs, on this machine, what llama.sh needs to build llama.cpp's llama-server, llama-bench and
# llama-batched-bench (CUDA, sm_90) on the GPU machine and to convert a synthetic checkpoint to
# GGUF there (the GPU machine has no network). Nothing of llama.cpp enters this repository: the
# sources come from a git directory made by the search tool's `fetch` of a llama.cpp repository
# and go, packed, to the git-ignored .device/llama/ (carry it with .device/bin and .device/data):
#   .device/llama/llama-src.tar.xz        the build subset: cmake files, ggml (core, CPU, CUDA),
#                                          src, include, common, vendor, tools (the web UI's
#                                          sources left out: it builds with an empty asset table),
#                                          convert_hf_to_gguf.py, conversion/, gguf-py/, the
#                                          gpt-oss chat template (models/templates)
#   .device/llama/tokenizer.json.xz       the gpt-oss tokenizer (shared/data/gpt-oss-20b), which
#   .device/llama/tokenizer_config.json   the GGUF conversion reads from the checkpoint directory
#   .device/llama/COMMIT                  the llama.cpp commit packed
# Usage: scripts/device/llama_src.sh [GIT_DIR]   (default: LLAMA_GIT, else the fetched mirror)
set -euo pipefail
cd "$(dirname "$0")/../.."
GIT=${1:-${LLAMA_GIT:-/work/.mirror/unslothai+llama.cpp/repo}}
DATA=${XSERV_DATA:-../shared/data}
DEST=.device/llama
REV=${LLAMA_REV:-HEAD}
mkdir -p "$DEST"
commit=$(git --git-dir="$GIT" rev-parse "$REV^{commit}")

# Everything the top-level CMakeLists.txt reaches with tests, examples and the unified app off,
# and ggml's CPU and CUDA backends only (ggml adds a backend's directory only when it is on).
git --git-dir="$GIT" ls-tree -r --name-only "$commit" | grep -E \
  -e '^(CMakeLists\.txt|LICENSE|convert_hf_to_gguf\.py)$' \
  -e '^(cmake|include|src|common|vendor|licenses|conversion)/' \
  -e '^gguf-py/(gguf/|pyproject\.toml$)' \
  -e '^ggml/(CMakeLists\.txt|cmake/|include/)' \
  -e '^ggml/src/[^/]+$' -e '^ggml/src/ggml-(cpu|cuda)/' \
  -e '^tools/' \
  -e '^scripts/ui-assets\.cmake$' \
  -e '^models/templates/openai-gpt-oss-120b\.jinja$' |
  grep -v -E -e '^tools/ui/.+' -e '^tools/server/(tests|bench)/' \
    -e '^tools/mtmd/(tests|legacy-models)/' -e '\.(mp3|mp4|jpeg|jpg|png|gguf)$' \
    > "$DEST/files.txt" || true
# The web UI's build files only (LLAMA_BUILD_UI=OFF, no prebuilt download: empty assets).
for f in tools/ui/CMakeLists.txt tools/ui/embed.cpp tools/ui/sources.cmake; do
  echo "$f" >> "$DEST/files.txt"
done
echo "$(wc -l < "$DEST/files.txt") files of llama.cpp $commit"
# (git archive may complain of blobs the mirror lacks outside the subset: docs/, models/*.gguf)
git --git-dir="$GIT" archive --format=tar --prefix=llama.cpp/ "$commit" $(cat "$DEST/files.txt") \
  2> >(grep -v -E "invalid object|cannot read" >&2) | xz -T2 -6 > "$DEST/llama-src.tar.xz.tmp"
[ "$(xz -dc "$DEST/llama-src.tar.xz.tmp" | tar -t | grep -vc '/$')" = "$(wc -l < "$DEST/files.txt")" ] ||
  { echo "llama-src.tar.xz misses files" >&2; exit 1; }
mv "$DEST/llama-src.tar.xz.tmp" "$DEST/llama-src.tar.xz"
echo "$commit" > "$DEST/COMMIT"
rm "$DEST/files.txt"

# The tokenizer (27 MB as text, ~3 MB packed); xz -9 takes a minute and a half on 2 cores.
if [ ! -f "$DEST/tokenizer.json.xz" ] || [ "$DATA/gpt-oss-20b/tokenizer.json" -nt "$DEST/tokenizer.json.xz" ]; then
  xz -T2 -9 -c "$DATA/gpt-oss-20b/tokenizer.json" > "$DEST/tokenizer.json.xz.tmp"
  mv "$DEST/tokenizer.json.xz.tmp" "$DEST/tokenizer.json.xz"
fi
cp "$DATA/gpt-oss-20b/tokenizer_config.json" "$DEST/"
chmod u+w "$DEST"/*
du -b "$DEST"/* | awk '{printf "%8.2f MiB  %s\n", $1 / 1048576, $2}'
du -sb .device/bin .device/data "$DEST" | awk '{s += $1; printf "%8.2f MiB  %s\n", $1 / 1048576, $2}
  END {printf "%8.2f MiB  carried in all (the cap is 64 MiB with the working tree)\n", s / 1048576}'
