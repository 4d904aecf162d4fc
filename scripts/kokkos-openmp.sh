#!/usr/bin/env bash
# Builds Kokkos 3.4.01 with the OpenMP backend from a registry source (PyPI's pykokkos-base 0.0.7
# sdist carries Kokkos' source under external/kokkos) and installs it into a cache folder that
# later runs reuse. Prints the install prefix (a Kokkos_ROOT) on its last line.
#   scripts/kokkos-openmp.sh [PREFIX]   (default: ${GSHARD_CACHE:-~/.cache/gshard}/kokkos-3.4.01-openmp)
set -euo pipefail
cache=${GSHARD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gshard}
prefix=${1:-$cache/kokkos-3.4.01-openmp}
if [ -f "$prefix/.complete" ]; then
  echo "$prefix"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# pip prepares the sdist's metadata with its build backend (scikit-build), so both live in a
# venv of our own (Debian's python3 refuses pip installs outside one).
venv="$cache/venv"
[ -x "$venv/bin/pip" ] || python3 -m venv "$venv" >&2
"$venv/bin/pip" install -q scikit-build >&2
"$venv/bin/pip" download -q --no-deps --no-binary :all: --no-build-isolation -d "$work" \
  pykokkos-base==0.0.7 >&2
tar -xzf "$work"/pykokkos-base-0.0.7.tar.gz -C "$work"
src="$work/pykokkos-base-0.0.7/external/kokkos"
[ -f "$src/CMakeLists.txt" ] || { echo "kokkos-openmp: no Kokkos source in the sdist" >&2; exit 1; }
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_STANDARD=17 \
  -DKokkos_ENABLE_OPENMP=ON -DKokkos_ENABLE_SERIAL=ON -DKokkos_ENABLE_TESTS=OFF \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_POSITION_INDEPENDENT_CODE=ON >&2
cmake --build "$work/build" -j "$(nproc)" >&2
cmake --install "$work/build" >&2
touch "$prefix/.complete"
echo "$prefix"
