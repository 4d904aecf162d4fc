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
//   gshard_T   T = 4096, 8192, 16384; S 1024, M 512, H 2048, E 8 (the shape)
//   tutel      Tutel's helloworld: M = H = 2048, 2 experts per rank, top-2 with Tutel's capacity
//              factor 1 (C = k cf T / E, so cf 2 here); 2048 tokens per rank (Tutel: 16 x 512;
//              cut 4x to keep a step near 5 s on one core), one group per 512 tokens.
//   weak       weak scaling: 2 experts per rank, 2048 tokens per rank in groups of 512, M 512, H
//   2048.
// Modes (--modes, comma-separated, or "all"; each case runs every mode on the same x, r and
// expert weights):
//   cf2, cf1.25     the capacity path at capacity factor 2 (the default, today's rows) and 1.25:
//                   E G C rows computed (padded), assignments over C dropped
//   dropless        MoeOptions::dropless: exactly the routed assignments computed, none dropped
//   cf2_skew,       the same two on a skewed router: --skew added to every entry of the router's
//   dropless_skew   columns of experts 0 and 1 (one rank's block when E >= 2 ranks), so the tokens
//                   whose features sum above 0 (about half) route both choices to those two
// After the timed steps, one more step under the deterministic counters: per-rank peak bytes of
// Kokkos allocations, contraction FLOPs and AllToAll(v) bytes sent (max over ranks), contraction
// FLOPs summed over ranks, and the routing of that step (kept assignments per expert, dropped
// fraction); then the process's peak resident set (getrusage ru_maxrss, max over ranks: the
// process's high-water mark so far, so of every case and mode run before it in the process).
// Expert FLOPs of a step (analytic): 3 (forward, two backward GEMMs) x 2 GEMMs x 2 M H per row,
// rows = E C G for the capacity path (padding included), the routed assignments for dropless.
// GEMM-bound limit: those FLOPs at the best one-core sgemm rate (fastest of 2 x 10 runs) measured
// here on the experts' GEMM shapes ([rows, M] x [M, H] and [rows, H] x [H, M], rows = C G, or the
// routed assignments / E for dropless), times the rank count (one core each); of limit = tokens/s
// over that limit = the step's GEMM-bound share.
// Imbalance: max over ranks / mean of the kept assignments each rank's experts receive (experts
// in blocks of ceil(E / ranks)); the capacity path computes E C G / ranks rows per rank whatever
// it.
//
// Split (--split-csv PATH): after those, --reps more steps each under a gshard::Trace; a step's
// communication is the time inside its traced collectives (summed per rank, max over ranks), its
// compute the rest. Then the step's collectives, in order and with the same bytes, are replayed
// as bare MPI calls (MPI_Alltoall, MPI_Allreduce, ...) on preallocated buffers, --reps times: the
// hand-written reference for the communication (AllToAllv replayed as an even MPI_Alltoall of the
// largest rank's bytes).
//
// Usage: bench_moe [--csv PATH] [--reps N] [--warmup N] [--only TEXT] [--modes LIST] [--skew B]
//                  [--split-csv PATH]
#include <mpi.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gshard/gshard.hpp>

#include "cli.hpp"
#include "gemm_rate.hpp"
#include "moe_step.hpp"

namespace {

namespace gs = gshard;
using bench::Line, bench::X, bench::Wg, bench::Wi, bench::Wo, bench::median, bench::now;

struct Options {
  std::string csv = "bench_moe.csv";
  int reps = 5;
  int warmup = 1;
  std::string only;
  std::string modes = "cf2";
  double skew = 0.5;
  std::string split_csv;  // empty: no split
};

// The command line, through CLI11 (as the main job); nullopt: run, else the exit code.
std::optional<int> parse(int argc, char** argv, Options& o, bool print) {
  CLI::App app{"bench_moe: the MoE layer's forward + backward, tokens/s (bench/moe.cpp)"};
  app.add_option("--csv", o.csv, "CSV output file");
  app.add_option("--reps", o.reps, "timed steps per case")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--only", o.only, "cases whose name contains this text (\"weak\": weak scaling)");
  app.add_option("--modes", o.modes,
                 "comma-separated: cf2, cf1.25, dropless, cf2_skew, dropless_skew, or all");
  app.add_option("--skew", o.skew, "added to the router's columns of experts 0 and 1 (_skew)");
  app.add_option("--split-csv", o.split_csv,
                 "also split traced steps into compute and communication, against bare MPI");
  return bench::parse_cli(app, argc, argv, print);
}

struct Case {
  std::string name;
  std::int64_t tokens, s, m, h, e;
  [[nodiscard]] std::int64_t groups() const { return tokens / s; }
};

// How a case's layer runs: the capacity path at a capacity factor, or dropless; router balanced
// or skewed toward experts 0 and 1.
struct Mode {
  std::string name;
  bool dropless;
  double cf;  // capacity path only
  bool skew;
};

const std::vector<Mode>& all_modes() {
  static const std::vector<Mode> modes = {{"cf2", false, 2.0, false},
                                          {"cf1.25", false, 1.25, false},
                                          {"dropless", true, 0.0, false},
                                          {"cf2_skew", false, 2.0, true},
                                          {"dropless_skew", true, 0.0, true}};
  return modes;
}

std::vector<Mode> chosen_modes(const std::string& list) {
  if (list == "all") return all_modes();
  std::vector<Mode> out;
  std::stringstream in(list);
  for (std::string name; std::getline(in, name, ',');) {
    const auto it = std::find_if(all_modes().begin(), all_modes().end(),
                                 [&](const Mode& m) { return m.name == name; });
    if (it == all_modes().end()) throw gs::Error("bench_moe", "no mode \"" + name + "\"");
    out.push_back(*it);
  }
  return out;
}

gs::nn::MoeOptions options(const Mode& mode) {
  return {.k = 2,
          .capacity_factor = mode.dropless ? 2.0 : mode.cf,
          .min_capacity = 4,
          .second_expert = gs::nn::SecondExpert::all,
          .dropless = mode.dropless};
}

// Expert FLOPs of a step for `rows` rows through the experts: 3 (forward and two backward GEMMs)
// x 2 GEMMs x 2 M H per row.
double expert_flops(double rows, const Case& c) {
  return 3.0 * 2.0 * 2.0 * rows * static_cast<double>(c.m * c.h);
}

// Best one-core sgemm GFLOP/s on the experts' two GEMM shapes (rows per expert).
// The router with `bias` added to every entry of the columns of experts 0 and 1.
Wg skewed(const Line& mesh, const Wg& wg, double bias) {
  std::vector<float> w = wg.to_global();
  const std::int64_t e = wg.shape()[1];
  for (std::size_t i = 0; i < w.size(); ++i)
    if (static_cast<std::int64_t>(i) % e < 2) w[i] += static_cast<float>(bias);
  return gs::from_global<Wg>(mesh, wg.shape(), w);
}

// Max over ranks / mean of the kept assignments each rank's block of ceil(E / ranks) experts
// receives, and the max.
std::pair<double, std::int64_t> imbalance(const std::vector<std::int64_t>& per_expert, int ranks) {
  const auto e = static_cast<std::int64_t>(per_expert.size());
  const std::int64_t block = (e + ranks - 1) / ranks;
  std::vector<std::int64_t> per_rank(static_cast<std::size_t>(ranks), 0);
  for (std::int64_t i = 0; i < e; ++i)
    per_rank[static_cast<std::size_t>(i / block)] += per_expert[static_cast<std::size_t>(i)];
  const std::int64_t total = std::accumulate(per_rank.begin(), per_rank.end(), std::int64_t{0});
  const std::int64_t most = *std::max_element(per_rank.begin(), per_rank.end());
  const double mean = static_cast<double>(total) / ranks;
  return {mean > 0 ? static_cast<double>(most) / mean : 1.0, most};
}

// This process's peak resident set so far, MB (Linux: ru_maxrss in KiB).
// A step split into compute and communication (seconds, max over ranks, medians), and the same
// collectives replayed as bare MPI calls.
struct Split {
  double step = 0, comm = 0, mpi = 0;
  double transfer = 0;            // per collective the shortest rank's time, summed: no waiting
  double calls = 0, mb_sent = 0;  // per step, on the rank that sends most
  std::string kinds;              // "AllToAll x4, AllReduce x3"
};

// The bare MPI call of one traced collective: `bytes` is what gshard's counters record (sent to
// the other k - 1 ranks; 2 (k - 1) / k of the buffer for AllReduce).
void replay(const std::string& kind, double bytes, int k, float* a, float* b) {
  const auto per_peer = static_cast<int>(bytes / (4.0 * (k - 1)));
  if (kind == "AllToAll" || kind == "AllToAllv") {
    MPI_Alltoall(a, per_peer, MPI_FLOAT, b, per_peer, MPI_FLOAT, MPI_COMM_WORLD);
  } else if (kind == "AllReduce") {
    const auto n = std::max(1, static_cast<int>(bytes * k / (8.0 * (k - 1))));
    MPI_Allreduce(MPI_IN_PLACE, a, n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else if (kind == "AllGather") {
    MPI_Allgather(a, per_peer, MPI_FLOAT, b, per_peer, MPI_FLOAT, MPI_COMM_WORLD);
  } else if (kind == "ReduceScatter") {
    MPI_Reduce_scatter_block(a, b, per_peer, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  } else {
    throw gs::Error("bench_moe", "no bare MPI replay for the collective " + kind);
  }
}

// Needs more than one rank (one rank has no collectives to replay).
Split split_step(X& x, Wg& wg, Wi& wi, Wo& wo, const X& r, const gs::nn::MoeOptions& opts,
                 int reps) {
  int k = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &k);
  std::vector<double> steps, comms, transfers, mpis;
  std::vector<std::string> kinds;
  std::vector<double> bytes;
  for (int i = 0; i < reps; ++i) {
    gs::Trace trace(MPI_COMM_WORLD);
    trace.begin_step();
    steps.push_back(bench::moe_step(x, wg, wi, wo, r, opts));
    trace.end_step();
    double comm = 0;
    std::vector<double> each;
    for (const auto& e : trace.events()) {
      if (std::string_view(e.category) != "collective") continue;
      comm += e.duration_us * 1e-6;
      each.push_back(e.duration_us * 1e-6);
      if (i == 0) {
        kinds.push_back(e.name);
        bytes.push_back(static_cast<double>(e.bytes));
      }
    }
    comms.push_back(bench::max_over_ranks(comm));
    // The rank that arrives last at a collective waits for no one: its time is the transfer.
    MPI_Allreduce(MPI_IN_PLACE, each.data(), static_cast<int>(each.size()), MPI_DOUBLE, MPI_MIN,
                  MPI_COMM_WORLD);
    transfers.push_back(std::accumulate(each.begin(), each.end(), 0.0));
  }
  // Every rank replays the same calls: the largest rank's bytes for each.
  MPI_Allreduce(MPI_IN_PLACE, bytes.data(), static_cast<int>(bytes.size()), MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  const double most = bytes.empty() ? 0 : *std::max_element(bytes.begin(), bytes.end());
  // Page-aligned, touched once: a buffer's alignment alone changed MPI_Allreduce's time 3.7x
  // (bench/reshard.cpp).
  const std::size_t floats = static_cast<std::size_t>(most * k / 4.0) + 1024;
  const std::size_t size = (floats * sizeof(float) + 4095) / 4096 * 4096;
  std::unique_ptr<float, decltype(&std::free)> a(
      static_cast<float*>(std::aligned_alloc(4096, size)), &std::free),
      b(static_cast<float*>(std::aligned_alloc(4096, size)), &std::free);
  if (!a || !b) throw gs::Error("bench_moe", "cannot allocate the replay's buffers");
  std::fill_n(a.get(), size / sizeof(float), 1.0f);
  std::fill_n(b.get(), size / sizeof(float), 0.0f);
  for (int i = 0; i < reps + 1; ++i) {  // the first a warm-up
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now();
    for (std::size_t j = 0; j < kinds.size(); ++j) replay(kinds[j], bytes[j], k, a.get(), b.get());
    const double t = bench::max_over_ranks(now() - t0);
    if (i > 0) mpis.push_back(t);
  }
  Split s{median(steps),
          median(comms),
          median(mpis),
          median(transfers),
          static_cast<double>(kinds.size()),
          0,
          ""};
  std::map<std::string, int> count;
  for (std::size_t j = 0; j < kinds.size(); ++j) {
    s.mb_sent += bytes[j] / 1e6;
    ++count[kinds[j]];
  }
  for (const auto& [kind, n] : count)
    s.kinds += (s.kinds.empty() ? "" : ", ") + kind + " x" + std::to_string(n);
  return s;
}

double peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) * 1024.0 / 1e6;
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
    const std::vector<Mode> modes = chosen_modes(o.modes);
    const Line mesh(MPI_COMM_WORLD, {ranks});
    gs::memory_counters().enable();
    std::vector<Case> cases;
    for (const std::int64_t t : {4096, 8192, 16384})
      cases.push_back({"gshard_" + std::to_string(t), t, 1024, 512, 2048, 8});
    cases.push_back({"tutel", 2048 * ranks, 512, 2048, 2048, 2 * ranks});
    // Weak scaling: 2 experts per rank (top-2 needs 2 on one rank), 2048 tokens per rank (4
    // groups of 512), M 512, H 2048.
    cases.push_back({"weak", 2048 * ranks, 512, 512, 2048, 2 * ranks});

    std::FILE* csv = nullptr;
    std::FILE* split_csv = nullptr;
    if (rank == 0 && !o.split_csv.empty()) {
      split_csv = std::fopen(o.split_csv.c_str(), "w");
      if (!split_csv) throw gs::Error("bench_moe", "cannot write " + o.split_csv);
      std::fprintf(split_csv,
                   "case,mode,ranks,step_s,comm_s,compute_s,transfer_s,mpi_s,gshard_over_mpi,calls,"
                   "mb_sent_per_rank,collectives\n");
    }
    if (rank == 0) {
      csv = std::fopen(o.csv.c_str(), "w");
      if (!csv) throw gs::Error("bench_moe", "cannot write " + o.csv);
      std::fprintf(csv,
                   "case,ranks,tokens,group,M,H,E,capacity,seconds,tokens_per_s,expert_gflop,"
                   "gemm_gflops_per_core,limit_tokens_per_s,fraction_of_limit,peak_mb_per_rank,"
                   "gflop_per_rank,all_to_all_mb_sent_per_rank,mode,dropless,capacity_factor,"
                   "skew,routed,computed_rows,dropped_fraction,imbalance,max_rank_rows,"
                   "gflop_counted,rss_peak_mb\n");
      std::printf("bench_moe: %d rank(s), forward+backward, median of %d after %d warm-up(s)\n",
                  ranks, o.reps, o.warmup);
      std::printf("%-12s %-13s %7s %6s %5s %5s %4s %5s %9s %12s %14s %8s %8s %6s %9s\n", "case",
                  "mode", "tokens", "group", "M", "H", "E", "C", "s/step", "tokens/s",
                  "limit tok/s", "of limit", "dropped", "imbal", "peak MB");
    }
    for (const Case& c : cases) {
      // "weak" runs only when asked for (bench/run_moe.sh runs it on 1..16 ranks).
      if (o.only.empty() ? c.name == "weak" : c.name.find(o.only) == std::string::npos) continue;
      X x = gs::random_normal<X>(mesh, {c.groups(), c.s, c.m}, 1, 0.0f, 1.0f);
      Wg wg_balanced = gs::random_normal<Wg>(mesh, {c.m, c.e}, 2, 0.0f, 0.05f);
      Wi wi = gs::random_normal<Wi>(mesh, {c.e, c.m, c.h}, 3, 0.0f, 0.04f);
      Wo wo = gs::random_normal<Wo>(mesh, {c.e, c.h, c.m}, 4, 0.0f, 0.02f);
      const X r = gs::random_normal<X>(mesh, {c.groups(), c.s, c.m}, 5, 0.0f, 1.0f);
      for (const Mode& mode : modes) {
        Wg wg = mode.skew ? skewed(mesh, wg_balanced, o.skew) : wg_balanced;
        const gs::nn::MoeOptions opts = options(mode);
        const std::int64_t cap = mode.dropless ? 0 : gs::nn::moe_capacity(c.s, c.e, opts);
        // Rows per expert of the GEMM-rate shapes: C G, or the routed assignments (k T, every
        // second choice dispatched) over E for dropless.
        const std::int64_t rows = mode.dropless ? 2 * c.tokens / c.e : cap * c.groups();
        // The GEMM rate is measured before and after the steps (10 runs each, fastest kept): one
        // measurement alone varied by 10% on a shared VM.
        double gemm = bench::gemm_gflops(rows, c.m, c.h, 10);
        std::vector<double> times;
        for (int i = 0; i < o.warmup + o.reps; ++i) {
          const double t = bench::moe_step(x, wg, wi, wo, r, opts);
          if (i >= o.warmup) times.push_back(t);
        }
        const double t = median(times);
        // One more step under the deterministic counters: peak bytes, FLOPs, AllToAll bytes and
        // the routing.
        auto& memory = gs::memory_counters();
        memory.reset_peak();
        gs::flop_counters().reset();
        // AllToAll bytes: the capacity path's AllToAll, dropless's counts (AllToAll) and rows
        // (AllToAllv).
        const auto a2a = [] {
          return gs::comm_counters().get("x", gs::Collective::all_to_all).bytes +
                 gs::comm_counters().get("x", gs::Collective::all_to_all_v).bytes;
        };
        const std::int64_t a2a0 = a2a();
        bench::MoeStats stats;
        bench::moe_step(x, wg, wi, wo, r, opts, &stats);
        const std::int64_t a2a1 = a2a();
        double counted[4] = {static_cast<double>(memory.peak_bytes()),
                             static_cast<double>(gs::flop_counters().contraction()),
                             static_cast<double>(a2a1 - a2a0), peak_rss_mb()};
        MPI_Allreduce(MPI_IN_PLACE, counted, 4, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double flops_total = static_cast<double>(gs::flop_counters().contraction());
        MPI_Allreduce(MPI_IN_PLACE, &flops_total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
        // Every rank measures the GEMM alone at the same time: one core each, as in the step.
        gemm = std::max(gemm, bench::gemm_gflops(rows, c.m, c.h, 10));
        MPI_Allreduce(MPI_IN_PLACE, &gemm, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
        const std::int64_t kept = std::accumulate(stats.tokens_per_expert.begin(),
                                                  stats.tokens_per_expert.end(), std::int64_t{0});
        const double routed = stats.dropped_fraction < 1
                                  ? static_cast<double>(kept) / (1.0 - stats.dropped_fraction)
                                  : 0.0;
        const double computed_rows = mode.dropless
                                         ? static_cast<double>(kept)
                                         : static_cast<double>(c.e * stats.capacity * c.groups());
        const double flops = expert_flops(computed_rows, c);
        const auto [imbal, max_rows] = imbalance(stats.tokens_per_expert, ranks);
        const double limit =
            static_cast<double>(c.tokens) / (flops / (gemm * 1e9 * static_cast<double>(ranks)));
        const double rate = static_cast<double>(c.tokens) / t;
        if (rank == 0) {
          std::printf(
              "%-12s %-13s %7lld %6lld %5lld %5lld %4lld %5lld %9.3f %12.0f %14.0f %7.1f%% "
              "%7.1f%% %6.2f %9.1f\n",
              c.name.c_str(), mode.name.c_str(), static_cast<long long>(c.tokens),
              static_cast<long long>(c.s), static_cast<long long>(c.m), static_cast<long long>(c.h),
              static_cast<long long>(c.e), static_cast<long long>(stats.capacity), t, rate, limit,
              100.0 * rate / limit, 100.0 * stats.dropped_fraction, imbal, counted[0] / 1e6);
          std::fprintf(csv,
                       "%s,%d,%lld,%lld,%lld,%lld,%lld,%lld,%.6f,%.1f,%.3f,%.2f,%.1f,%.4f,%.3f,"
                       "%.3f,%.4f,%s,%d,%.2f,%.3f,%.0f,%.0f,%.6f,%.4f,%lld,%.3f,%.1f\n",
                       c.name.c_str(), ranks, static_cast<long long>(c.tokens),
                       static_cast<long long>(c.s), static_cast<long long>(c.m),
                       static_cast<long long>(c.h), static_cast<long long>(c.e),
                       static_cast<long long>(stats.capacity), t, rate, flops / 1e9, gemm, limit,
                       rate / limit, counted[0] / 1e6, counted[1] / 1e9, counted[2] / 1e6,
                       mode.name.c_str(), mode.dropless ? 1 : 0, mode.dropless ? 0.0 : mode.cf,
                       mode.skew ? o.skew : 0.0, routed, computed_rows, stats.dropped_fraction,
                       imbal, static_cast<long long>(max_rows), flops_total / 1e9, counted[3]);
          std::fflush(stdout);
          std::fflush(csv);
        }
        if (!o.split_csv.empty() && ranks > 1) {
          const Split sp = split_step(x, wg, wi, wo, r, opts, o.reps);
          if (rank == 0) {
            std::printf(
                "  split: step %.3f s = compute %.3f + communication %.3f (of which "
                "transfer %.3f; %s, %.1f MB sent per rank); the same calls in bare MPI "
                "%.3f s (%.2fx of the transfer)\n",
                sp.step, sp.step - sp.comm, sp.comm, sp.transfer, sp.kinds.c_str(), sp.mb_sent,
                sp.mpi, sp.mpi / sp.transfer);
            std::fprintf(split_csv, "%s,%s,%d,%.6f,%.6f,%.6f,%.6f,%.6f,%.4f,%.0f,%.3f,\"%s\"\n",
                         c.name.c_str(), mode.name.c_str(), ranks, sp.step, sp.comm,
                         sp.step - sp.comm, sp.transfer, sp.mpi, sp.mpi / sp.transfer, sp.calls,
                         sp.mb_sent, sp.kinds.c_str());
            std::fflush(split_csv);
          }
        }
      }
    }
    if (csv) std::fclose(csv);
    if (split_csv) std::fclose(split_csv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_moe [rank %d]: %s\n", rank, e.what());
    status = 1;
  }
  return status;
}
