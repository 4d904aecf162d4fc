#!/usr/bin/env bash
# Configures and builds every gshard target (examples, benchmarks, every test executable) against
# a given Kokkos install (CUDA, HIP, OpenMP, ...) and summarises what compiled. Nothing is run:
# the point is that the same source compiles for the device. Each target is built on its own, so
# one failure does not hide the others; the log of each failed target is kept.
#   scripts/check-device-build.sh KOKKOS_ROOT [BUILD_DIR] [TARGET_REGEX]
# Environment: JOBS (default nproc), CXX (default: the Kokkos install's nvcc_wrapper for a CUDA
# Kokkos, else c++), GSHARD_DEVICE_BUILD_TYPE (default Release), EXTRA_CMAKE_ARGS.
# Exit status: 0 when every selected target compiled and linked.
set -euo pipefail
if [ $# -lt 1 ]; then
  echo "usage: $0 KOKKOS_ROOT [BUILD_DIR] [TARGET_REGEX]" >&2
  exit 2
fi
root=$(cd "$1" && pwd)
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${2:-$src/build/device-$(basename "$root")}
filter=${3:-.}
jobs=${JOBS:-$(nproc)}

config=$(find "$root" -name KokkosCore_config.h -print -quit)
[ -n "$config" ] || { echo "check-device-build: no KokkosCore_config.h under $root" >&2; exit 2; }
backends=$(grep -oE '#define KOKKOS_ENABLE_(CUDA|HIP|SYCL|OPENMP|THREADS|SERIAL|OPENMPTARGET)\b' \
  "$config" | sed 's/#define KOKKOS_ENABLE_//' | sort -u | tr '\n' ' ')
if [ -z "${CXX:-}" ]; then
  if grep -q '#define KOKKOS_ENABLE_CUDA\b' "$config" && [ -x "$root/bin/nvcc_wrapper" ]; then
    CXX=$root/bin/nvcc_wrapper
  else
    CXX=c++
  fi
fi
echo "check-device-build: Kokkos at $root (backends: $backends), compiler $CXX, build in $build"

mkdir -p "$build/logs"
# Ninja when present: one keep-going build keeps every core busy, and its log times each file.
generator=()
if command -v ninja > /dev/null && [ ! -f "$build/Makefile" ]; then generator=(-G Ninja); fi
# shellcheck disable=SC2086
cmake -S "$src" -B "$build" "${generator[@]}" -DKokkos_ROOT="$root" -DCMAKE_CXX_COMPILER="$CXX" \
  -DCMAKE_BUILD_TYPE="${GSHARD_DEVICE_BUILD_TYPE:-Release}" -DGSHARD_WARNINGS_AS_ERRORS=OFF \
  ${EXTRA_CMAKE_ARGS:-} > "$build/logs/configure.log" 2>&1 || {
  tail -30 "$build/logs/configure.log" >&2
  echo "check-device-build: configure failed ($build/logs/configure.log)" >&2
  exit 1
}

# Every executable of ours: tests, examples, benchmarks (compile-fail cases are excluded: they
# must not compile). The helper libraries build as dependencies of the first target needing them.
mapfile -t targets < <(cmake --build "$build" --target help |
  sed -n -e 's/^\.\.\. \([^ ]*\).*/\1/p' -e 's/^\([A-Za-z0-9_.-]*\): phony$/\1/p' |
  grep -vE '^(all|clean|depend|edit_cache|rebuild_cache|install|install/.*|list_install_components|test|format|format-check|.*_pch|.*\.gch|gshard_test_main|harness_probe|compile_fail_.*|.*\.o|.*\.i|.*\.s|.*\.cpp|.*\.cmake|.*/.*|help|.*_autogen.*)$' |
  grep -E "$filter" | sort -u)
echo "check-device-build: ${#targets[@]} targets"

start=$(date +%s)
ok=() failed=()
if [ -f "$build/build.ninja" ]; then
  # One build of all selected targets, going on past failures. A target compiled and linked when
  # its executable exists and no failed step belongs to it (a stale executable of an earlier build
  # does not count: its failed compile step names the target's object directory).
  ninja -C "$build" -k 0 -j "$jobs" "${targets[@]}" > "$build/logs/build.log" 2>&1 || true
  for t in "${targets[@]}"; do
    out=$(ninja -C "$build" -t query "$t" 2>/dev/null | awk '/input: phony/ {getline; print $1; exit}')
    if [ -n "$out" ] && [ -f "$build/$out" ] &&
      ! grep -E "^FAILED: " "$build/logs/build.log" | grep -qE "CMakeFiles/$t\.dir/|[/ ]$t\$"; then
      ok+=("$t")
    else
      failed+=("$t")
      echo "  FAILED $t (see $build/logs/build.log)"
    fi
  done
  # Compile time per source file, slowest first (.ninja_log: start and end in ms, output).
  awk -F'\t' '!/^#/ && $4 ~ /\.o$/ {n = $4; sub(/^.*CMakeFiles\/[^\/]*\.dir\//, "", n);
      sub(/\.o$/, "", n); t[n] = ($2 - $1) / 1000} END {for (n in t) printf "%8.1f s  %s\n", t[n], n}' \
    "$build/.ninja_log" | sort -rn > "$build/logs/compile-times.txt"
  echo "check-device-build: slowest files (all in $build/logs/compile-times.txt):"
  head -5 "$build/logs/compile-times.txt"
else
  # Shared pieces first, so their time is not charged to the first target.
  cmake --build "$build" --target gshard_test_main -j "$jobs" > "$build/logs/gshard_test_main.log" 2>&1 || true
  for t in "${targets[@]}"; do
    t0=$(date +%s)
    if cmake --build "$build" --target "$t" -j "$jobs" > "$build/logs/$t.log" 2>&1; then
      ok+=("$t")
      printf '  ok     %-45s %5d s\n' "$t" $(($(date +%s) - t0))
    else
      failed+=("$t")
      printf '  FAILED %-45s %5d s  (%s)\n' "$t" $(($(date +%s) - t0)) "$build/logs/$t.log"
    fi
  done
fi
elapsed=$(($(date +%s) - start))

# Warnings that signal wrong device behaviour: host code called from host-device code.
host_calls=$(cat "$build"/logs/*.log | grep -cE 'calling a __host__ function|host function .* from a __host__ __device__|cannot be called from a __host__ __device__' || true)
echo "check-device-build: ${#ok[@]} of ${#targets[@]} targets compiled and linked in ${elapsed} s" \
  "(backends: $backends); host-from-device warnings: $host_calls"
[ ${#failed[@]} -eq 0 ] || { printf '  failed: %s\n' "${failed[@]}"; exit 1; }
[ "$host_calls" -eq 0 ] || exit 1
