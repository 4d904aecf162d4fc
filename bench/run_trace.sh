#!/usr/bin/env bash
# Builds bench_trace and bench_trace_compiled_out (release preset), runs them alternately on
# RANKS ranks (default 2) for ROUNDS rounds (default 5), and prints the medians and ratios:
# tracing off against trace sites compiled out (the cost of the sites when off), and tracing on
# against off. Arguments go to both programs (--reps, --warmup). Timings of separate processes
# vary by up to 20% on a shared VM: compare the medians of several rounds.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh
cmake --preset release >/dev/null
cmake --build build/release -j2 --target bench_trace bench_trace_compiled_out
out=build/release/bench
log="$out/bench_trace.log"
: >"$log"
echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) core(s), load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$log"
for round in $(seq "${ROUNDS:-5}"); do
  for exe in bench_trace bench_trace_compiled_out; do
    mpirun --oversubscribe --bind-to none -n "${RANKS:-2}" "$out/$exe" "$@" | tee -a "$log"
  done
done
python3 - "$log" <<'PY'
import re, statistics, sys
rows = [re.search(r"\((compiled \w+)\).*off ([\d.]+) ms, on ([\d.]+) ms per step \((\d+) events", l)
        for l in open(sys.argv[1])]
rows = [r for r in rows if r]
off_in = [float(r.group(2)) for r in rows if r.group(1) == "compiled in"]
on_in = [float(r.group(3)) for r in rows if r.group(1) == "compiled in"]
off_out = [float(r.group(2)) for r in rows if r.group(1) == "compiled out"]
events = rows[0].group(4)
m = statistics.median
print("| step (ms, median of %d rounds) | trace sites compiled out | compiled in, off | compiled in, on (%s events/step) |" % (len(off_in), events))
print("|---|---|---|---|")
print("| time | %.3f | %.3f | %.3f |" % (m(off_out), m(off_in), m(on_in)))
print("| ratio | 1 | %.3f | %.3f |" % (m(off_in) / m(off_out), m(on_in) / m(off_out)))
print("tracing on / off, paired in one process: median %.3f" % m([a / b for a, b in zip(on_in, off_in)]))
PY
