#!/usr/bin/env bash
# Installs what building and testing deca needs, skipping what is already there (safe to rerun):
# Debian packages (apt-get update runs once, only when something is missing), the CUDA toolkit
# located (headers + NVRTC) and exported for CMake, and pinned PyPI packages in a virtual
# environment.
# Sourced by tools/test.sh (everything; sets DECA_PYTHON) and tools/bench.sh, which sets
# DECA_DEPS=bench first: deca-bench needs only the build packages and the toolkit, no Python.
set -euo pipefail

# deca-bench and the library: compiler, CMake, CLI11, nlohmann-json.
deca_apt_build_packages=(cmake g++ git libcli11-dev nlohmann-json3-dev)
# The test suites and the Python module on top of those.
deca_apt_test_packages=(libgtest-dev libgmock-dev python3-dev python3-venv)
deca_pip_packages=(scikit-build-core==0.11.6 nanobind==2.9.2 numpy==2.4.6 pytest==9.2.0 ml_dtypes==0.6.0
  jax==0.10.2 jaxlib==0.10.2 scipy==1.17.1 opt_einsum==3.4.0 hypothesis==6.155.2)

# apt-get that waits for another package manager instead of failing with "Could not get lock
# /var/lib/dpkg/lock-frontend" (a fresh machine often runs an unattended upgrade at boot):
# DPkg::Lock::Timeout makes apt-get itself wait for the dpkg lock; a lock it does not wait for
# (the package lists' during `update`) is retried here until the same deadline.
# DECA_APT_LOCK_TIMEOUT: seconds to wait (default 600).
deca_apt_get() {
  local timeout=${DECA_APT_LOCK_TIMEOUT:-600}
  local deadline=$((SECONDS + timeout)) err rc said=0
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  err=$(mktemp)
  while :; do
    rc=0
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get -o DPkg::Lock::Timeout="$timeout" "$@" 2> "$err" || rc=$?
    if [ "$rc" -ne 0 ] && grep -q 'Could not get lock' "$err" && [ "$SECONDS" -lt "$deadline" ]; then
      if [ "$said" -eq 0 ]; then
        echo "install_deps: another apt-get or dpkg holds the package lock; waiting (up to ${timeout} s)"
        said=1
      fi
      sleep 5
      continue
    fi
    cat "$err" >&2
    rm -f "$err"
    return "$rc"
  done
}

deca_install_apt() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "install_deps: apt-get install ${missing[*]}"
  deca_apt_get update -qq
  deca_apt_get install -y -qq --no-install-recommends "${missing[@]}"
}

# The toolkit root is where bin/nvcc and NVRTC live together. `nvcc` on PATH may be a wrapper
# script (this machine kind has /usr/local/bin/nvcc exec'ing the real one), so its directory is not
# the root: candidates are tried in order and the first with both wins. The root is exported for
# CMake's FindCUDAToolkit (CUDAToolkit_ROOT, CUDACXX) and put first on PATH.
deca_cuda_has_nvrtc() {
  ls "$1"/lib64/libnvrtc.so* "$1"/lib/libnvrtc.so* "$1"/targets/*/lib/libnvrtc.so* > /dev/null 2>&1
}

deca_check_cuda() {
  local candidates=()
  [ -n "${CUDA_HOME:-}" ] && candidates+=("$CUDA_HOME")
  [ -n "${CUDA_PATH:-}" ] && candidates+=("$CUDA_PATH")
  candidates+=(/usr/local/cuda)
  local nvcc
  if nvcc=$(command -v nvcc 2> /dev/null); then
    candidates+=("$(dirname "$(readlink -f "$nvcc")")/..")
    # nvcc reports its own install root (TOP) in a dry run, whatever wraps it.
    local top
    top=$(nvcc --dryrun -x cu -c /dev/null -o /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n 1 || true)
    [ -n "$top" ] && candidates+=("$top")
  fi
  candidates+=(/usr/local/cuda-*)
  local root="" c
  for c in "${candidates[@]}"; do
    if [ -x "$c/bin/nvcc" ] && deca_cuda_has_nvrtc "$c"; then
      root=$(cd "$c" && pwd -P)
      break
    fi
  done
  if [ -z "$root" ]; then
    echo "install_deps: no CUDA toolkit with nvcc and NVRTC (libnvrtc.so) was found; looked in:" >&2
    printf '  %s\n' "${candidates[@]}" >&2
    echo "  deca needs CUDA 12.4+ (headers, cudart, NVRTC); install it, or set CUDA_HOME." >&2
    return 1
  fi
  export CUDA_HOME="$root" CUDAToolkit_ROOT="$root" CUDACXX="$root/bin/nvcc"
  export PATH="$root/bin:$PATH"
}

# Python packages go into a virtual environment (.venv in the repository unless DECA_PYTHON names
# an interpreter): Debian's own python3 refuses pip installs (PEP 668), and CI must not depend on
# which python3 comes first on its PATH.
deca_install_pip() {
  if [ -z "${DECA_PYTHON:-}" ]; then
    local venv=${DECA_VENV:-$PWD/.venv}
    if [ ! -x "$venv/bin/python" ]; then
      echo "install_deps: creating the Python environment $venv"
      python3 -m venv "$venv"
    fi
    DECA_PYTHON="$venv/bin/python"
  fi
  export DECA_PYTHON
  "$DECA_PYTHON" -m pip install -q --disable-pip-version-check "${deca_pip_packages[@]}"
}

case "${DECA_DEPS:-all}" in
  bench)
    deca_install_apt "${deca_apt_build_packages[@]}"
    deca_check_cuda
    ;;
  all)
    deca_install_apt "${deca_apt_build_packages[@]}" "${deca_apt_test_packages[@]}"
    deca_check_cuda
    deca_install_pip
    ;;
  *)
    echo "install_deps: DECA_DEPS: expected bench or all, got '$DECA_DEPS'" >&2
    return 1 2> /dev/null || exit 1
    ;;
esac
