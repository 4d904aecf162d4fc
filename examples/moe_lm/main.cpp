// The main job: a byte-level multilingual MoE language model trained across ranks on Debian's
// fortune cookies. Every rank runs this program (SPMD); rank 0 prints and writes the files.
//   mpirun -n 4 moe_lm --mesh 2x2            (scripts/demo.sh; --help lists every option)
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <gshard/comm/counters.hpp>
#include <gshard/io/safetensors.hpp>
#include <gshard/mesh/environment.hpp>
#include <gshard/trace/timeline.hpp>

#include "cli.hpp"
#include "corpus.hpp"
#include "report.hpp"
#include "train.hpp"

namespace {

namespace fs = std::filesystem;

// Seconds since `start` on rank 0, the same on every rank (one broadcast): every rank must agree
// on when the time limit ends training.
double shared_elapsed(std::chrono::steady_clock::time_point start) {
  double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  MPI_Bcast(&t, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  return t;
}

// The collectives of one training step, per axis and kind, from the counters' difference.
std::string step_collectives(const gshard::CommCounters& before,
                             const gshard::CommCounters& after) {
  std::string out = "plan: collectives of one training step on this rank (calls, bytes sent):\n";
  for (const auto& [key, c] : after.all()) {
    const gshard::CommCount b = before.get(key.first, key.second);
    if (c.calls == b.calls) continue;
    char line[160];
    std::snprintf(line, sizeof line, "  %-18s over %-18s %5lld calls %10.3f MB\n",
                  gshard::collective_name(key.second), key.first.c_str(),
                  static_cast<long long>(c.calls - b.calls),
                  static_cast<double>(c.bytes - b.bytes) / 1e6);
    out += line;
  }
  return out;
}

// Checkpoints: <dir>/step_<N>.safetensors, each complete (written atomically); the newest two
// are kept. The newest one is where a restarted run resumes.
fs::path checkpoint_path(const fs::path& dir, std::int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "step_%08lld.safetensors", static_cast<long long>(step));
  return dir / name;
}

std::vector<fs::path> checkpoints(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() == 25 && name.starts_with("step_") && name.ends_with(".safetensors"))
      out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The newest checkpoint's path as rank 0 sees it, on every rank ("" when none).
std::string newest_checkpoint(const fs::path& dir, bool root) {
  std::string path;
  if (root) {
    const auto all = checkpoints(dir);
    if (!all.empty()) path = all.back().string();
  }
  int n = static_cast<int>(path.size());
  MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD);
  path.resize(static_cast<std::size_t>(n));
  MPI_Bcast(path.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD);
  return path;
}

int run(int argc, char** argv, int rank, std::chrono::steady_clock::time_point start) {
  const bool root = rank == 0;
  moe_lm::Options o;
  if (const auto code = moe_lm::parse_options(o, argc, argv, root)) return *code;
  int ranks = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (moe_lm::mesh_ranks(o.mesh_shape) != ranks) {
    if (root)
      std::cerr << "moe_lm: --mesh " << o.mesh << " needs " << moe_lm::mesh_ranks(o.mesh_shape)
                << " ranks, but mpirun started " << ranks << "\n";
    return 2;
  }
  const moe_lm::Corpus corpus = moe_lm::load_corpus();
  const moe_lm::MeshT mesh = moe_lm::make_mesh(o.mesh_shape);
  moe_lm::Trainer trainer(mesh, o);
  if (root) {
    std::cout << "moe_lm: " << moe_lm::describe(o) << moe_lm::describe(corpus) << trainer.plan()
              << std::flush;
  }

  std::vector<std::string> codes;
  for (const auto& l : corpus.languages) codes.push_back(l.code);
  const std::int64_t eval_rows =
      std::max<std::int64_t>(1, static_cast<std::int64_t>(o.eval_batches) * o.batch /
                                    static_cast<std::int64_t>(codes.size()));
  std::vector<moe_lm::LossRecord> records;
  auto evaluate = [&](std::int64_t step) {
    const moe_lm::Evaluation e = trainer.evaluate(corpus, eval_rows);
    if (root)
      std::cout << moe_lm::format_held_out(step, e.loss, codes, e.per_language) << std::endl;
    return e;
  };
  std::int64_t tokens = 0, step = 0;
  const std::string resume_from =
      o.checkpoint_dir.empty() ? std::string() : newest_checkpoint(o.checkpoint_dir, root);
  moe_lm::Evaluation last_eval;
  // --steps 0: the count is fitted to the time limit at the warmup's end (at least 10 steps in,
  // for a steady step time; the cosine's decay starts there) or taken from the checkpoint, then
  // refitted at each evaluation.
  const std::int64_t fit_at = std::max<std::int64_t>(10, o.warmup);
  std::int64_t total = o.steps;
  double eval_s = 0;
  if (!resume_from.empty()) {
    const gshard::io::SafetensorsReader reader(mesh.comm(), resume_from);
    step = trainer.load(reader);
    records = moe_lm::parse_records(reader.metadata("moe_lm.records"));
    if (root) std::cout << "resumed from " << resume_from << " at step " << step << std::endl;
    const double t0 = shared_elapsed(start);
    last_eval = trainer.evaluate(corpus, eval_rows);
    eval_s = shared_elapsed(start) - t0;
    if (total == 0 && step >= fit_at) total = trainer.total_steps();  // fitted before
  } else {
    const double t0 = shared_elapsed(start);
    last_eval = evaluate(0);
    eval_s = shared_elapsed(start) - t0;
    records.push_back({0, std::nan(""), std::nan(""), last_eval.loss});
  }

  // --trace: the first trace_steps steps of this run, every rank, in one file.
  std::optional<gshard::Trace> trace;
  if (!o.trace.empty()) trace.emplace(mesh);
  const double train_start = shared_elapsed(start);
  double last_print = train_start;
  bool stopped_by_time = false;
  double first_step_end = 0;  // this run's first step: its end and index
  std::int64_t first_step = -1;
  while (total == 0 || step < total) {
    gshard::CommCounters before = gshard::comm_counters();
    const bool traced = trace && trace->steps() < o.trace_steps;
    if (traced) trace->begin_step();
    const moe_lm::StepStats s = trainer.step(corpus, step);
    if (traced) trace->end_step();
    if (step == 0 && root) std::cout << step_collectives(before, gshard::comm_counters());
    ++step;
    tokens += s.tokens;
    moe_lm::LossRecord r{step, s.loss, s.aux_loss, std::nan("")};
    const double now = shared_elapsed(start);
    const double trained = now - train_start;
    if (first_step < 0) first_step = step, first_step_end = now;
    // Fitted at the warmup's end, refitted at each evaluation: a shared machine's step time
    // drifts by several percent over minutes.
    if (o.steps == 0 && step >= fit_at && step > first_step &&
        (total == 0 || step % o.eval_every == 0)) {
      const bool first_fit = total == 0;
      const double step_s = (now - first_step_end) / static_cast<double>(step - first_step);
      total = moe_lm::fit_steps(step, step_s, eval_s, o.eval_every, now, o.time_limit, o.warmup);
      trainer.set_total_steps(total);
      if (root && first_fit)
        std::cout << "steps: " << total << ", fitted to the time limit (" << o.time_limit
                  << " s) at " << step_s << " s/step and " << eval_s << " s per evaluation"
                  << std::endl;
    }
    const bool out_of_time = o.time_limit > 0 && now >= o.time_limit;
    const bool eval_now = step % o.eval_every == 0 || step == total || out_of_time;
    if (root && (now - last_print >= 5 || step == 1 || eval_now)) {
      last_print = now;
      moe_lm::Progress p;
      p.step = step;
      p.steps = total > 0 ? total : step;
      p.loss = s.loss;
      p.aux_loss = s.aux_loss;
      p.dropped = s.dropped;
      p.tokens_per_s = static_cast<double>(tokens) / std::max(trained, 1e-9);
      p.eta_s = moe_lm::estimate_eta(step, total > 0 ? total : step, trained,
                                     o.time_limit > 0 ? o.time_limit - train_start : 0);
      std::cout << moe_lm::format_progress(p) << std::endl;
    }
    if (eval_now) {
      last_eval = evaluate(step);
      r.held_out_loss = last_eval.loss;
    }
    records.push_back(r);
    if (eval_now && !o.checkpoint_dir.empty()) {
      if (root) fs::create_directories(o.checkpoint_dir);
      trainer.save(checkpoint_path(o.checkpoint_dir, step).string(), step,
                   {{"moe_lm.records", moe_lm::records_text(records)}});
      if (root) {
        const auto all = checkpoints(o.checkpoint_dir);
        for (std::size_t i = 0; i + 2 < all.size(); ++i) fs::remove(all[i]);
      }
    }
    if (out_of_time) {
      stopped_by_time = total == 0 || step < total;
      break;
    }
  }
  const double trained = shared_elapsed(start) - train_start;
  if (trace) {
    trace->write_chrome(o.trace);
    const gshard::StepPlan plan = trace->plan();
    if (root) {
      std::cout << plan.text() << "wrote the trace of " << trace->steps() << " step(s) to "
                << o.trace << " and the step plan to " << o.trace << ".plan.json" << std::endl;
      std::ofstream(o.trace + ".plan.json") << plan.json() << "\n";
    }
  }

  const std::vector<std::string> samples = [&] {
    std::vector<std::string> prompts;
    for (int l = 0; l < static_cast<int>(codes.size()); ++l)
      prompts.push_back(moe_lm::prompt_for(corpus, l, 48));
    const auto text = trainer.generate(prompts, o.sample_bytes, o.seed);
    std::vector<std::string> out;
    for (std::size_t l = 0; l < text.size(); ++l) out.push_back(prompts[l] + text[l]);
    return out;
  }();

  if (root) {
    const fs::path dir = o.out;
    moe_lm::write_loss_csv(dir / "loss.csv", records);
    moe_lm::plot_loss_png(dir / "loss.csv", dir / "loss.png");
    moe_lm::ExpertLoad load(codes, o.experts);
    for (std::size_t l = 0; l < codes.size(); ++l)
      for (int e = 0; e < o.experts; ++e)
        load.add(static_cast<int>(l), e,
                 static_cast<double>(last_eval.load[l][static_cast<std::size_t>(e)]));
    moe_lm::write_load_csv(dir / "expert_load.csv", load);
    moe_lm::plot_load_png(dir / "expert_load.csv", dir / "expert_load.png");
    std::ofstream text(dir / "samples.txt", std::ios::binary | std::ios::trunc);
    std::cout << "samples (prompt: the start of a held-out cookie; " << o.sample_bytes
              << " bytes sampled at temperature 0.8):\n";
    for (std::size_t l = 0; l < codes.size(); ++l) {
      text << "== " << codes[l] << " ==\n" << samples[l] << "\n";
      std::cout << "[" << codes[l] << "] " << moe_lm::printable(samples[l]) << "\n";
    }
    std::printf(
        "done: %lld steps%s in %.0f s, %.0f tokens/s; held-out loss %.4f -> %.4f nats/byte "
        "(unigram entropy %.4f)\nwrote %s/{loss.csv,loss.png,expert_load.csv,expert_load.png,"
        "samples.txt}\n",
        static_cast<long long>(step), stopped_by_time ? " (time limit)" : "", trained,
        static_cast<double>(tokens) / std::max(trained, 1e-9), records.front().held_out_loss,
        last_eval.loss, moe_lm::unigram_entropy(corpus), dir.string().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const auto start = std::chrono::steady_clock::now();         // the time limit counts start-up too
  gshard::Environment env(argc, argv, {.tune_malloc = true});  // owns its process
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    return run(argc, argv, rank, start);
  } catch (const std::exception& e) {
    std::cerr << "moe_lm [rank " << rank << "]: " << e.what() << std::endl;
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 1;
}
