// bench_moe: the MoE layer's forward + backward (gshard::nn::moe, index-based dispatch, top-2,
// the random second-expert policy off: every second choice dispatched) on every rank of
// MPI_COMM_WORLD, tokens/s; and the GEMM-bound limit of this machine for the same layer.
//
// Layouts: x "G:x S M" (groups over all ranks), router "M E" replicated, experts "E:x M H" and
// "E:x H M" (E over all ranks), one Mesh<"x">. A step: track x and the weights, y = moe(...),
// loss = sum(y * r) + aux_loss (r a fixed random tensor, so every gradient is dense), grad of the
// loss with respect to x, router and experts. Times are the max over ranks of each step, median
// over --reps steps after --warmup.
//
// Cases (T tokens in all, S per group, M, H, E experts, capacity factor cf: C = S cf / E):
//   gshard_T   T = 4096, 8192, 16384; S 1024, M 512, H 2048, E 8, cf 2 (the shape)
//   tutel      Tutel's helloworld: M = H = 2048, 2 experts per rank, top-2 with Tutel's capacity
//              factor 1 (C = k cf T / E, so cf 2 here); 2048 tokens per rank (Tutel: 16 x 512;
//              cut 4x to keep a step near 5 s on one core), one group per 512 tokens.
//   weak       weak scaling: 2 experts per rank, 2048 tokens per rank in groups of 512, M 512, H
//   2048.
// After the timed steps, one more step under the deterministic counters: per-rank peak bytes of
// Kokkos allocations, contraction FLOPs and AllToAll bytes sent (max over ranks).
// Expert FLOPs of a step: 3 (forward, two backward GEMMs) x 2 GEMMs x 2 E C G M H.
// GEMM-bound limit: those FLOPs at the best one-core sgemm rate (fastest of 2 x 10 runs) measured
// here on the experts' GEMM shapes ([C G, M] x [M, H] and [C G, H] x [H, M]), times the rank count
// (one core each).
//
// Usage: bench_moe [--csv PATH] [--reps N] [--warmup N] [--only TEXT]
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gshard/gshard.hpp>

#include "moe_step.hpp"

#if defined(GSHARD_HAVE_CBLAS)
#include <cblas.h>
#else
#include <Eigen/Core>
#endif

namespace {

namespace gs = gshard;
using bench::Line, bench::X, bench::Wg, bench::Wi, bench::Wo, bench::median, bench::now;

struct Options {
  std::string csv = "bench_moe.csv";
  int reps = 5;
  int warmup = 1;
  std::string only;
};

// The command line, through CLI11 (as the main job); nullopt: run, else the exit code.
std::optional<int> parse(int argc, char** argv, Options& o, bool print) {
  CLI::App app{"bench_moe: the MoE layer's forward + backward, tokens/s (bench/moe.cpp)"};
  app.add_option("--csv", o.csv, "CSV output file");
  app.add_option("--reps", o.reps, "timed steps per case")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--only", o.only, "cases whose name contains this text (\"weak\": weak scaling)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    if (print) std::fprintf(code ? stderr : stdout, "%s%s", out.str().c_str(), err.str().c_str());
    return code;
  }
  return std::nullopt;
}

struct Case {
  std::string name;
  std::int64_t tokens, s, m, h, e;
  double cf;
  [[nodiscard]] std::int64_t groups() const { return tokens / s; }
  [[nodiscard]] std::int64_t capacity() const {
    return static_cast<std::int64_t>(static_cast<double>(s) * cf / static_cast<double>(e));
  }
  [[nodiscard]] double expert_flops() const {
    return 3.0 * 2.0 * 2.0 * static_cast<double>(e * capacity() * groups()) *
           static_cast<double>(m * h);
  }
};

double step(X& x, Wg& wg, Wi& wi, Wo& wo, const X& r, const Case& c) {
  return bench::moe_step(x, wg, wi, wo, r,
                         {.k = 2,
                          .capacity_factor = c.cf,
                          .min_capacity = 4,
                          .second_expert = gs::nn::SecondExpert::all});
}

// Best one-core sgemm GFLOP/s on the experts' two GEMM shapes (rows = C G per expert).
double gemm_gflops(std::int64_t rows, std::int64_t m, std::int64_t h, int reps) {
  std::vector<float> a(static_cast<std::size_t>(rows * std::max(m, h)), 0.5f);
  std::vector<float> b(static_cast<std::size_t>(m * h), 0.25f);
  std::vector<float> c(static_cast<std::size_t>(rows * std::max(m, h)), 0.0f);
  double best = 0;
  for (const auto& [k, n] : {std::pair{m, h}, std::pair{h, m}}) {
    std::vector<double> times;
    for (int i = 0; i < reps + 1; ++i) {
      const double t0 = now();
#if defined(GSHARD_HAVE_CBLAS)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(n), static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k),
                  b.data(), static_cast<int>(n), 0.0f, c.data(), static_cast<int>(n));
#else
      using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::Map<Mat>(c.data(), rows, n).noalias() =
          Eigen::Map<const Mat>(a.data(), rows, k) * Eigen::Map<const Mat>(b.data(), k, n);
#endif
      if (i > 0) times.push_back(now() - t0);
    }
    const double fastest = *std::min_element(times.begin(), times.end());
    best = std::max(best, 2.0 * static_cast<double>(rows * k * n) / fastest / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  gs::Environment env(argc, argv, {.tune_malloc = true});  // owns its process
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  int status = 0;
  try {
    Options o;
    if (const auto code = parse(argc, argv, o, rank == 0)) return *code;
    const Line mesh(MPI_COMM_WORLD, {ranks});
    gs::memory_counters().enable();
    std::vector<Case> cases;
    for (const std::int64_t t : {4096, 8192, 16384})
      cases.push_back({"gshard_" + std::to_string(t), t, 1024, 512, 2048, 8, 2.0});
    cases.push_back({"tutel", 2048 * ranks, 512, 2048, 2048, 2 * ranks, 2.0});
    // Weak scaling: 2 experts per rank (top-2 needs 2 on one rank), 2048 tokens per rank (4
    // groups of 512), M 512, H 2048.
    cases.push_back({"weak", 2048 * ranks, 512, 512, 2048, 2 * ranks, 2.0});

    std::FILE* csv = nullptr;
    if (rank == 0) {
      csv = std::fopen(o.csv.c_str(), "w");
      if (!csv) throw gs::Error("bench_moe", "cannot write " + o.csv);
      std::fprintf(csv,
                   "case,ranks,tokens,group,M,H,E,capacity,seconds,tokens_per_s,expert_gflop,"
                   "gemm_gflops_per_core,limit_tokens_per_s,fraction_of_limit,peak_mb_per_rank,"
                   "gflop_per_rank,all_to_all_mb_sent_per_rank\n");
      std::printf("bench_moe: %d rank(s), forward+backward, median of %d after %d warm-up(s)\n",
                  ranks, o.reps, o.warmup);
      std::printf("%-12s %7s %6s %5s %5s %4s %5s %9s %12s %14s %8s\n", "case", "tokens", "group",
                  "M", "H", "E", "C", "s/step", "tokens/s", "limit tok/s", "of limit");
    }
    for (const Case& c : cases) {
      // "weak" runs only when asked for (bench/run_moe.sh runs it on 1..16 ranks).
      if (o.only.empty() ? c.name == "weak" : c.name.find(o.only) == std::string::npos) continue;
      X x = gs::random_normal<X>(mesh, {c.groups(), c.s, c.m}, 1, 0.0f, 1.0f);
      Wg wg = gs::random_normal<Wg>(mesh, {c.m, c.e}, 2, 0.0f, 0.05f);
      Wi wi = gs::random_normal<Wi>(mesh, {c.e, c.m, c.h}, 3, 0.0f, 0.04f);
      Wo wo = gs::random_normal<Wo>(mesh, {c.e, c.h, c.m}, 4, 0.0f, 0.02f);
      const X r = gs::random_normal<X>(mesh, {c.groups(), c.s, c.m}, 5, 0.0f, 1.0f);
      // The GEMM rate is measured before and after the steps (10 runs each, fastest kept): one
      // measurement alone varied by 10% on a shared VM.
      const std::int64_t rows = c.capacity() * c.groups();
      double gemm = gemm_gflops(rows, c.m, c.h, 10);
      std::vector<double> times;
      for (int i = 0; i < o.warmup + o.reps; ++i) {
        const double t = step(x, wg, wi, wo, r, c);
        if (i >= o.warmup) times.push_back(t);
      }
      const double t = median(times);
      // One more step under the deterministic counters: peak bytes, FLOPs and AllToAll bytes.
      auto& memory = gs::memory_counters();
      memory.reset_peak();
      gs::flop_counters().reset();
      const gs::CommCount a2a0 = gs::comm_counters().get("x", gs::Collective::all_to_all);
      step(x, wg, wi, wo, r, c);
      const gs::CommCount a2a1 = gs::comm_counters().get("x", gs::Collective::all_to_all);
      double counted[3] = {static_cast<double>(memory.peak_bytes()),
                           static_cast<double>(gs::flop_counters().contraction()),
                           static_cast<double>(a2a1.bytes - a2a0.bytes)};
      MPI_Allreduce(MPI_IN_PLACE, counted, 3, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      // Every rank measures the GEMM alone at the same time: one core each, as in the step.
      gemm = std::max(gemm, gemm_gflops(rows, c.m, c.h, 10));
      MPI_Allreduce(MPI_IN_PLACE, &gemm, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
      const double limit = static_cast<double>(c.tokens) /
                           (c.expert_flops() / (gemm * 1e9 * static_cast<double>(ranks)));
      const double rate = static_cast<double>(c.tokens) / t;
      if (rank == 0) {
        std::printf("%-12s %7lld %6lld %5lld %5lld %4lld %5lld %9.3f %12.0f %14.0f %7.1f%%\n",
                    c.name.c_str(), static_cast<long long>(c.tokens), static_cast<long long>(c.s),
                    static_cast<long long>(c.m), static_cast<long long>(c.h),
                    static_cast<long long>(c.e), static_cast<long long>(c.capacity()), t, rate,
                    limit, 100.0 * rate / limit);
        std::fprintf(csv,
                     "%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%.6f,%.1f,%.3f,%.2f,%.1f,%.4f,%.3f,%.3f,"
                     "%.4f\n",
                     c.name.c_str(), ranks, static_cast<long long>(c.tokens),
                     static_cast<long long>(c.s), static_cast<long long>(c.m),
                     static_cast<long long>(c.h), static_cast<long long>(c.e),
                     static_cast<long long>(c.capacity()), t, rate, c.expert_flops() / 1e9, gemm,
                     limit, rate / limit, counted[0] / 1e6, counted[1] / 1e9, counted[2] / 1e6);
        std::fflush(stdout);
      }
    }
    if (csv) std::fclose(csv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_moe [rank %d]: %s\n", rank, e.what());
    status = 1;
  }
  return status;
}
