#!/usr/bin/env bash
# Packs a base commit for a same-machine A/B in a GPU round: .ab/base.tgz (the commit's tree, as
# git archive writes it) and .ab/base.commit. Carry ".ab" to the device; tools/gpu_round.sh then
# builds the base's deca-bench beside the round's own, and the bench variant `base` runs it
# (DECA_BENCH_VARIANTS="base default base default").
#
#   tools/ab_pack.sh COMMIT
set -euo pipefail
commit=${1:?usage: tools/ab_pack.sh COMMIT}
root=$(cd "$(dirname "$0")/.." && pwd)
sha=$(git -C "$root" rev-parse --short "$commit^{commit}")
mkdir -p "$root/.ab"
git -C "$root" archive --prefix=base/ "$sha" -- . ':(exclude)bench/results' | gzip > "$root/.ab/base.tgz"
echo "$sha" > "$root/.ab/base.commit"
echo "ab_pack: .ab/base.tgz = $sha ($(du -h "$root/.ab/base.tgz" | cut -f1))"
