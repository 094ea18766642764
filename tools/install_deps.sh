#!/usr/bin/env bash
# Installs what building and testing deca needs, skipping what is already there (safe to rerun):
# Debian packages (apt-get update runs once, only when something is missing), pinned PyPI
# packages, and a check that the CUDA toolkit (headers + NVRTC) is present.
# Sourced by tools/test.sh and tools/bench.sh; sets DECA_PYTHON.
set -euo pipefail

deca_apt_packages=(cmake g++ git libgtest-dev libgmock-dev libcli11-dev nlohmann-json3-dev python3-dev)
deca_pip_packages=(scikit-build-core==0.11.6 nanobind==2.9.2 numpy==2.4.6 pytest==9.2.0 ml_dtypes==0.6.0)

deca_install_apt() {
  local missing=()
  for p in "${deca_apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  echo "install_deps: apt-get install ${missing[*]}"
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

deca_check_cuda() {
  local cuda=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
  if ! command -v nvcc > /dev/null && [ -x "$cuda/bin/nvcc" ]; then
    export PATH="$cuda/bin:$PATH"
  fi
  if ! command -v nvcc > /dev/null; then
    echo "install_deps: the CUDA toolkit was not found (no nvcc on PATH nor in $cuda/bin)." >&2
    echo "  deca needs CUDA 12.4+ (headers, cudart, NVRTC); install it, or set CUDA_HOME." >&2
    return 1
  fi
  local root
  root=$(cd "$(dirname "$(command -v nvcc)")/.." && pwd)
  if ! ls "$root"/lib64/libnvrtc.so* "$root"/lib/libnvrtc.so* "$root"/targets/*/lib/libnvrtc.so* \
       > /dev/null 2>&1; then
    echo "install_deps: NVRTC (libnvrtc.so) is missing from the CUDA toolkit at $root." >&2
    return 1
  fi
}

deca_install_pip() {
  DECA_PYTHON=${DECA_PYTHON:-$(command -v python3)}
  export DECA_PYTHON
  "$DECA_PYTHON" -m pip install -q --disable-pip-version-check --root-user-action=ignore "${deca_pip_packages[@]}"
}

deca_install_apt
deca_check_cuda
deca_install_pip
