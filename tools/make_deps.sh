#!/usr/bin/env bash
# Packs what tools/gpu_round.sh needs on a GPU machine that has no package registry (GoogleTest
# sources, CLI11 and nlohmann-json headers with their CMake configs) into .deps/, from this
# machine's Debian packages. .deps/ is ignored by git; pass it to the device run as a carried path.
#
#   bash tools/make_deps.sh && echo "/.deps/" >> .git/info/exclude
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/tools/install_deps.sh" > /dev/null
deps="$root/.deps"
rm -rf "$deps"
mkdir -p "$deps/prefix/include" "$deps/prefix/share/cmake" "$deps/src"
cp -r /usr/include/CLI /usr/include/nlohmann "$deps/prefix/include/"
cp -r /usr/share/cmake/CLI11 /usr/share/cmake/nlohmann_json "$deps/prefix/share/cmake/"
cp -r /usr/src/googletest "$deps/src/"
grep -qx "/.deps/" "$root/.git/info/exclude" 2>/dev/null || echo "/.deps/" >> "$root/.git/info/exclude"
du -sh "$deps"
