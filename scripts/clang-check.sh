#!/usr/bin/env bash
# The clang pass of CI: every source of ours (tests, examples, benchmarks) through clang 19's
# front end (-fsyntax-only, so templates are instantiated and checked, but no code is generated),
# then the compile-fail cases, whose diagnostics must match under clang as under g++.
#   scripts/clang-check.sh [BUILD_DIR]      (default build/clang; needs clang++-19)
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$src/build/clang}
jobs=$(nproc)
command -v clang++-19 >/dev/null || { echo "clang-check: clang++-19 missing (apt-get install clang-19)" >&2; exit 1; }

cmake -S "$src" -B "$build" -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS_DEBUG=-O0 -DGSHARD_WARNINGS_AS_ERRORS=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  > "$build.configure.log" 2>&1 || { tail -30 "$build.configure.log" >&2; exit 1; }
# The precompiled headers the commands below use (and the test main they depend on).
cmake --build "$build" --target gshard_test_pch gshard_compile_fail_pch -j "$jobs" > /dev/null

# One syntax-only command per translation unit of ours; compile-fail cases are checked below.
mkdir -p "$build/syntax"
python3 - "$build/compile_commands.json" "$src" "$build/syntax" <<'EOF'
import json, re, shlex, sys
entries, src, out = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
n = 0
for e in entries:
    f = e["file"]
    if not f.startswith(src) or "/compile_fail/" in f or "/harness/compile_fail_probe" in f:
        continue
    if f.endswith("pch_anchor.cpp") or "/build/" in f[len(src):]:
        continue
    cmd = re.sub(r"\s-o\s+\S+", " ", e["command"]) + " -fsyntax-only"
    with open(f"{out}/{n:04d}.sh", "w") as s:
        s.write(f"cd {shlex.quote(e['directory'])} && {cmd}\n# {f}\n")
    n += 1
print(f"clang-check: {n} translation units", file=sys.stderr)
EOF
failed=0
start=$(date +%s)
if ! ls "$build"/syntax/*.sh | xargs -P "$jobs" -I{} sh -c 'sh {} > {}.log 2>&1 || { echo "  FAILED $(tail -1 {})"; cat {}.log | head -40; exit 1; }'; then
  failed=1
fi
echo "clang-check: syntax pass in $(($(date +%s) - start)) s"
# The compile-fail cases: one build at a time in this tree (they share it).
ctest --test-dir "$build" -L compile_fail --output-on-failure -j "$jobs" || failed=1
exit $failed
