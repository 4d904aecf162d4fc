#!/usr/bin/env bash
# What the network costs: bench_reshard's AllToAll and AllReduce cases and bench_moe's weak-scaling
# step (split into compute and communication, against the same collectives in bare MPI), each on
# N ranks of one host (shared memory) and on N hosts x 1 rank of the multi-host test bed
# (scripts/hosts.sh: TCP between network namespaces, links shaped to RATE), N in HOSTS. Writes
# the network table of docs/performance.md (bench/network_table.py).
#
#   bench/run_network.sh                      # HOSTS="2 4", RATE=10gbit, 30 reshard repetitions
#   HOSTS=2 RATE=1gbit bench/run_network.sh
#
# Needs root (network namespaces); exits 77 where the bed cannot be made. Timings are only
# meaningful on an otherwise idle machine: `vmstat` before each run is recorded.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
# shellcheck source=../scripts/mpi-env.sh
source scripts/mpi-env.sh
scripts/hosts.sh check >/dev/null || exit $?

cmake --preset release >/dev/null
cmake --build build/release -j2 --target bench_reshard bench_moe

out=build/release/bench
rate=${RATE:-10gbit}
meta="$out/bench_network.meta"
cpu="$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//' || true)"
{
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), ${cpu:-unknown CPU}, $(nproc) core(s)," \
    "$(mpirun --version 2>/dev/null | head -1), kernel $(uname -r); links between hosts shaped" \
    "to $rate (tc tbf; this kernel has no netem, so no added delay)"
} >"$meta"
idle() { vmstat 1 2 | tail -1 | awk '{print $15}'; }
reshard=(--only "AllToAll,AllReduce" --sizes "1,4,16" --reps "${REPS:-30}")
moe=(--only weak --reps "${MOE_REPS:-5}")
csvs=()
for n in ${HOSTS:-2 4}; do
  # One host, shared memory (Open MPI's default BTLs): the reference for what the network costs.
  echo "1x$n: one host, $n ranks, shared memory; CPU idle before the run $(idle)%" >>"$meta"
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_reshard" "${reshard[@]}" \
    --csv "$out/network_reshard.1x$n.csv"
  mpirun --oversubscribe --bind-to none -n "$n" "$out/bench_moe" "${moe[@]}" \
    --csv "$out/network_moe.1x$n.csv" --split-csv "$out/network_split.1x$n.csv"
  # n hosts x 1 rank: every message crosses a link.
  echo "${n}x1: $n hosts x 1 rank, TCP at $rate; CPU idle before the run $(idle)%" >>"$meta"
  scripts/hosts.sh run "$n" 1 --rate "$rate" --timeout 600 -- "$out/bench_reshard" "${reshard[@]}" \
    --csv "$out/network_reshard.${n}x1.csv"
  scripts/hosts.sh run "$n" 1 --rate "$rate" --timeout 600 -- "$out/bench_moe" "${moe[@]}" \
    --csv "$out/network_moe.${n}x1.csv" --split-csv "$out/network_split.${n}x1.csv"
  for layout in "1x$n" "${n}x1"; do
    csvs+=("$out/network_reshard.$layout.csv" "$out/network_split.$layout.csv")
  done
done
python3 bench/network_table.py --doc docs/performance.md --meta "$meta" "${csvs[@]}"
