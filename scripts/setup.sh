#!/usr/bin/env bash
# Installs what xserv needs from Debian (skipping what is there) and builds it in build/.
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake ninja-build ccache pkg-config libfmt-dev doctest-dev llvm-16-dev
          nlohmann-json3-dev libpcre2-dev libboost-dev python3 python3-pip)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "[setup] error: the CUDA toolkit is not at /usr/local/cuda (xserv builds against it;" >&2
  echo "        a GPU is not needed to build or test)." >&2
  exit 1
fi

# xgrammar (structured output) from its pinned PyPI source package, the one thing fetched with pip.
./scripts/fetch_xgrammar.sh

build_type=${XSERV_BUILD_TYPE:-Release}
jobs=${XSERV_JOBS:-$(nproc)}
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE="$build_type" \
    -DCUDAToolkit_ROOT=/usr/local/cuda >/dev/null
fi
echo "[setup] building with $jobs jobs"
cmake --build build -j "$jobs"
