#!/usr/bin/env bash
# xgrammar's C++ core, the grammar engine behind structured output (engine/constraint.cpp),
# pinned to one version: its source package from PyPI (checked against the digest below), with
# the fixes in scripts/xgrammar-VERSION-*.patch applied (each says what it fixes), built as a
# static library with its Python bindings off, installed into .deps/xgrammar-VERSION-PATCHES.
# Idempotent: nothing happens when that install is there. CMake finds it there
# (XSERV_XGRAMMAR_ROOT).
set -euo pipefail
cd "$(dirname "$0")/.."
version=0.2.8
sha256=8305646fd2b319d6c3003f51a1665e54cbbe9cba1fb636bc41d0b46434ccbb80
patches=(scripts/xgrammar-$version-*.patch)
prefix=$PWD/.deps/xgrammar-$version-${#patches[@]} # a new patch: a new install
[ -f "$prefix/lib/libxgrammar.a" ] && exit 0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "[xgrammar] fetching the xgrammar $version source package"
python3 -m pip download --quiet --no-deps --no-binary xgrammar "xgrammar==$version" -d "$work"
archive="$work/xgrammar-$version.tar.gz"
echo "$sha256  $archive" | sha256sum --check --quiet || {
  echo "[xgrammar] error: $archive is not the source package this build pins" >&2
  exit 1
}
tar xzf "$archive" -C "$work"
src="$work/xgrammar-$version"
for p in "${patches[@]}"; do
  echo "[xgrammar] applying $(basename "$p")"
  patch -s -p1 -d "$src" < "$p"
done
mkdir -p "$src/build"
printf 'set(XGRAMMAR_BUILD_PYTHON_BINDINGS OFF)\nset(XGRAMMAR_BUILD_CXX_TESTS OFF)\n' \
  > "$src/build/config.cmake"
launcher=()
# ccache with the temporary directory as its base: a rebuild (a clean clone) hits the cache.
command -v ccache > /dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache) &&
  export CCACHE_BASEDIR="$work"
# Its own flags carry -Werror and -flto=auto: ours come after them.
cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="-fno-lto -Wno-error" -DCMAKE_INSTALL_PREFIX="$prefix" > /dev/null
echo "[xgrammar] building (static, no Python bindings)"
cmake --build "$src/build" -j "${XSERV_JOBS:-$(nproc)}" > "$work/build.log" 2>&1 || {
  tail -30 "$work/build.log" >&2
  exit 1
}
cmake --install "$src/build" > /dev/null
echo "[xgrammar] installed in $prefix"
