// bench_moe_lm_step: one training step of the main job's model (examples/moe_lm: the same Trainer,
// so the same code path: batch sampling, forward, backward, global-norm clipping, AdamW, router
// balancing) on every rank of MPI_COMM_WORLD, tokens/s; and the GEMM-bound limit of this machine
// for the step's contraction FLOPs. bench/run_moe_lm_step.sh runs it beside PyTorch eager
// (bench/moe_lm_peer.py) on the same model and shapes.
//
// Times: each step's time is the slowest rank's; the median of --steps after --warmup.
// GEMM-bound limit: the step's contraction FLOPs (gshard's counters, summed over ranks: forward
// and backward, attention's score and weighted-sum einsums included) at the best one-core sgemm
// rate measured here on the FFN's shape ([tokens per rank, d_model] x [d_model, ffn]), one core
// per rank up to the machine's cores; of limit = tokens/s over that limit.
// Profile (--profile N): N more steps under a gshard::Trace; rank 0's step plan (ops by self time,
// collectives) is printed, and written as JSON to --plan-json.
//
// Usage: mpirun -n N bench_moe_lm_step [--mesh DxE] [--steps N] [--warmup N] [--csv PATH]
//                                      [--profile N] [--plan-json PATH] [model options of moe_lm]
#include <mpi.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gshard/gshard.hpp>

#include "cli.hpp"
#include "common.hpp"
#include "gemm_rate.hpp"
#include "train.hpp"

namespace {

namespace gs = gshard;

struct BenchOptions {
  int steps = 10;
  int warmup = 2;
  int profile = 0;
  std::string csv = "bench_moe_lm_step.csv";
  std::string plan_json;
};

std::optional<int> parse(int argc, char** argv, moe_lm::Options& o, BenchOptions& b, bool print) {
  CLI::App app{"bench_moe_lm_step: the main job's training step, tokens/s (bench/moe_lm_step.cpp)"};
  app.add_option("--mesh", o.mesh, "data x expert [x model] (default 1 x ranks)");
  app.add_option("--d-model", o.d_model, "model width");
  app.add_option("--layers", o.layers, "transformer blocks");
  app.add_option("--heads", o.heads, "attention heads");
  app.add_option("--ffn", o.ffn, "FFN hidden size");
  app.add_option("--experts", o.experts, "experts per MoE layer");
  app.add_option("--context", o.context, "tokens per row");
  app.add_option("--batch", o.batch, "global rows per step");
  app.add_option("--routing", o.routing, "capacity or dropless");
  app.add_option("--steps", b.steps, "timed steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", b.warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--profile", b.profile, "traced steps after the timed ones (0: none)");
  app.add_option("--plan-json", b.plan_json, "rank 0's step plan of the traced steps, as JSON");
  app.add_option("--csv", b.csv, "CSV output file");
  if (const auto code = bench::parse_cli(app, argc, argv, print)) return code;
  o.mesh_shape = moe_lm::parse_mesh(o.mesh);
  return std::nullopt;
}

double max_over_ranks(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

double timed_step(moe_lm::Trainer& trainer, const moe_lm::Corpus& corpus, std::int64_t step) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  (void)trainer.step(corpus, step);
  return max_over_ranks(MPI_Wtime() - t0);
}

int run(int argc, char** argv, int rank, int ranks) {
  moe_lm::Options o;
  o.mesh = "1x" + std::to_string(ranks);
  BenchOptions b;
  if (const auto code = parse(argc, argv, o, b, rank == 0)) return *code;
  if (moe_lm::mesh_ranks(o.mesh_shape) != ranks)
    throw gs::Error("bench_moe_lm_step", "--mesh " + o.mesh + " needs " +
                                             std::to_string(moe_lm::mesh_ranks(o.mesh_shape)) +
                                             " ranks, not " + std::to_string(ranks));
  const moe_lm::Corpus corpus = moe_lm::load_corpus();
  const moe_lm::MeshT mesh = moe_lm::make_mesh(o.mesh_shape);
  moe_lm::Trainer trainer(mesh, o);
  std::int64_t step = 0;
  for (int i = 0; i < b.warmup; ++i) timed_step(trainer, corpus, step++);
  std::vector<double> times;
  for (int i = 0; i < b.steps; ++i) times.push_back(timed_step(trainer, corpus, step++));
  const double t = bench::median(times);

  // One more step under the counters: contraction FLOPs and Kokkos' peak bytes.
  gs::flop_counters().reset();
  gs::memory_counters().enable();
  gs::memory_counters().reset_peak();
  (void)timed_step(trainer, corpus, step++);
  double flops = static_cast<double>(gs::flop_counters().contraction());
  MPI_Allreduce(MPI_IN_PLACE, &flops, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  const double peak_mb =
      max_over_ranks(static_cast<double>(gs::memory_counters().peak_bytes())) / 1e6;
  const std::int64_t tokens = static_cast<std::int64_t>(o.batch) * o.context;
  const std::int64_t rows = tokens / std::max(o.mesh_shape[0], 1);  // tokens per data shard
  double gemm = bench::gemm_gflops(rows, o.d_model, o.ffn, 10);
  MPI_Allreduce(MPI_IN_PLACE, &gemm, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  // One core per rank, at most the machine's (oversubscribed ranks share them).
  const int cores = std::min<int>(ranks, std::max(1u, std::thread::hardware_concurrency()));
  const double limit = static_cast<double>(tokens) / (flops / (gemm * 1e9 * cores));
  const double rate = static_cast<double>(tokens) / t;

  if (rank == 0) {
    std::printf(
        "bench_moe_lm_step: %d rank(s), mesh %s, d_model %d, %d blocks, %d experts, batch %d x "
        "context %d: %.4f s/step (median of %d), %.0f tokens/s; %.3f GFLOP/step, sgemm %.1f "
        "GFLOP/s/core, GEMM-bound limit %.0f tokens/s, of limit %.1f%%; peak %.1f MB/rank\n",
        ranks, o.mesh.c_str(), o.d_model, o.layers, o.experts, o.batch, o.context, t, b.steps, rate,
        flops / 1e9, gemm, limit, 100 * rate / limit, peak_mb);
    std::FILE* csv = std::fopen(b.csv.c_str(), "w");
    if (!csv) throw gs::Error("bench_moe_lm_step", "cannot write " + b.csv);
    std::fprintf(csv,
                 "system,ranks,mesh,d_model,layers,experts,batch,context,tokens_per_step,seconds,"
                 "tokens_per_s,gflop_per_step,gemm_gflops_per_core,limit_tokens_per_s,"
                 "fraction_of_limit,peak_mb_per_rank\n");
    std::fprintf(csv, "gshard,%d,%s,%d,%d,%d,%d,%d,%lld,%.6f,%.1f,%.4f,%.2f,%.1f,%.4f,%.1f\n",
                 ranks, o.mesh.c_str(), o.d_model, o.layers, o.experts, o.batch, o.context,
                 static_cast<long long>(tokens), t, rate, flops / 1e9, gemm, limit, rate / limit,
                 peak_mb);
    std::fclose(csv);
  }

  if (b.profile > 0) {
    gs::Trace trace(MPI_COMM_WORLD);
    for (int i = 0; i < b.profile; ++i) {
      trace.begin_step();
      (void)trainer.step(corpus, step++);
      trace.end_step();
    }
    const gs::StepPlan plan = trace.plan();
    if (rank == 0) {
      std::printf("%s", plan.text(40).c_str());
      if (!b.plan_json.empty()) std::ofstream(b.plan_json) << plan.json() << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  gs::Environment env(argc, argv, {.tune_malloc = true});  // as the main job
  int rank = 0, ranks = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  try {
    return run(argc, argv, rank, ranks);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_moe_lm_step [rank %d]: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}
