#!/usr/bin/env bash
# The main job: builds deca-bench and runs it. Without arguments it runs its default preset:
# the GQA table on the GPU when there is one, else the CPU backend on the small preset.
# Arguments go to deca-bench, e.g.  bash tools/bench.sh --preset l70-b99-4k --check
#                                    bash tools/bench.sh --json bench/results/h200.json
# Installs only what deca-bench needs (build packages and the CUDA toolkit: no test stack, no
# Python) and builds it in its own folder (build-bench/, without the test suites).
set -euo pipefail
cd "$(dirname "$0")/.."
DECA_DEPS=bench source tools/install_deps.sh

jobs=${DECA_JOBS:-$(nproc)}
cmake --preset bench
cmake --build --preset bench --parallel "$jobs" --target deca-bench

# The commit recorded in --json output: the current one, marked when the tree has edits.
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$commit" != unknown ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  commit="$commit-dirty"
fi
export DECA_GIT_COMMIT=${DECA_GIT_COMMIT:-$commit}
exec build-bench/bench/deca-bench "$@"
