#!/usr/bin/env bash
# Installs, from Debian 12's packages, whatever gshard needs and is missing. Non-interactive,
# idempotent, and quick (no apt at all) when everything is already there.
#   scripts/install-deps.sh [build|test|demo|bench]   (default: build)
set -euo pipefail

purpose=${1:-build}
# libcli11-dev: examples/moe_lm parses its command line with CLI11 (header-only).
# nlohmann-json3-dev: the safetensors reader parses its JSON header with it (header-only).
# libhdf5-openmpi-dev: parallel HDF5 for io/hdf5.hpp (gshard::hdf5).
# libscalapack-openmpi-dev: bench_matmul's reference, ScaLAPACK's p?gemm (skipped without it).
packages=(g++ make cmake libopenmpi-dev openmpi-bin libeigen3-dev doctest-dev libtrilinos-kokkos-dev
  libopenblas-dev libcli11-dev nlohmann-json3-dev libhdf5-openmpi-dev libscalapack-openmpi-dev)
# The main job's corpus (Debian's fortune cookies, 8 languages) and its plots (gnuplot); the tests
# read the corpus and draw a plot too.
moe_lm=(fortunes fortunes-de fortunes-es fortunes-it fortunes-ru fortunes-pl fortunes-cs fortunes-zh
  gnuplot-nox)
# The test suite also fuzzes the file readers with clang's libFuzzer (tests/fuzz).
# Benchmarks (bench/run_moe.sh): PyTorch and the plots' matplotlib; JAX comes from PyPI into a venv.
bench=(python3-torch python3-matplotlib python3-venv python3-pip)
case "$purpose" in
  build) ;;
  bench) packages+=("${bench[@]}") ;;
  # clang-19: CI's clang pass; python3-venv: scripts/kokkos-openmp.sh fetches Kokkos' source;
  # python3-h5py, hdf5-tools (h5dump): the HDF5 files are checked by other readers.
  # iproute2 (ip, tc), procps (pgrep): the multi-host test bed, scripts/hosts.sh.
  test) packages+=(clang-format python3-numpy clang libclang-rt-14-dev clang-19 python3-venv
    python3-h5py hdf5-tools iproute2 procps "${moe_lm[@]}") ;;
  demo) packages+=("${moe_lm[@]}") ;;
  *) echo "usage: $0 [build|test|demo|bench]" >&2; exit 2 ;;
esac

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
