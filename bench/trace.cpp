// bench_trace: what tracing costs. A small training step (an MoE layer forward + backward with
// small sizes, so the step is short and made of many small ops: the worst case for per-op costs)
// timed three ways in one process: tracing off, and tracing on (a gshard::Trace recording every
// step). bench_trace_compiled_out is the same source built with GSHARD_NO_TRACE, where every trace
// site is removed by the compiler: the reference for "off". bench/run_trace.sh runs both,
// alternating, and prints the ratios.
//
// Times: max over ranks of each step, median of --reps steps after --warmup, per way.
// Usage: bench_trace [--reps N] [--warmup N] [--traced 0|1]   (0: untraced steps only, e.g. for
// counting instructions with perf stat where the machine has performance counters)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gshard/gshard.hpp>

#include "moe_step.hpp"

namespace {

namespace gs = gshard;
using bench::Line, bench::X, bench::Wg, bench::Wi, bench::Wo, bench::median;

double step(X& x, Wg& wg, Wi& wi, Wo& wo, const X& r) {
  return bench::moe_step(x, wg, wi, wo, r, {.k = 2, .capacity_factor = 2.0});
}

int arg(int argc, char** argv, const std::string& name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  gs::Environment env(argc, argv, {.tune_malloc = true});  // owns its process
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const int reps = arg(argc, argv, "--reps", 40), warmup = arg(argc, argv, "--warmup", 5);
  const bool traced = arg(argc, argv, "--traced", 1) != 0;  // 0: untraced steps only (perf stat)
  const Line mesh(MPI_COMM_WORLD, {ranks});
  const std::int64_t groups = 2 * ranks, s = 128, m = 64, h = 128, e = 2 * ranks;
  X x = gs::random_normal<X>(mesh, {groups, s, m}, 1);
  Wg wg = gs::random_normal<Wg>(mesh, {m, e}, 2, 0.0f, 0.05f);
  Wi wi = gs::random_normal<Wi>(mesh, {e, m, h}, 3, 0.0f, 0.05f);
  Wo wo = gs::random_normal<Wo>(mesh, {e, h, m}, 4, 0.0f, 0.05f);
  const X r = gs::random_normal<X>(mesh, {groups, s, m}, 5);
  for (int i = 0; i < warmup; ++i) step(x, wg, wi, wo, r);
  // Interleaved, so a slow phase of the machine hits both ways alike.
  std::vector<double> off, on;
  std::size_t events = 0;
  {
    gs::Trace trace(mesh);
    for (int i = 0; i < reps; ++i) {
      off.push_back(step(x, wg, wi, wo, r));
      if (!traced) continue;
      trace.begin_step();
      on.push_back(step(x, wg, wi, wo, r));
      trace.end_step();
    }
    events = trace.events().size() / static_cast<std::size_t>(std::max(trace.steps(), 1));
  }
#if defined(GSHARD_NO_TRACE)
  const char* build = "compiled out";
#else
  const char* build = "compiled in";
#endif
  if (rank == 0)
    std::printf(
        "bench_trace (%s): %d rank(s), %d steps each: off %.4f ms, on %.4f ms per step "
        "(%zu events per step)\n",
        build, ranks, reps, 1e3 * median(off), on.empty() ? 0.0 : 1e3 * median(on), events);
  return 0;
}
