#pragma once
// The main job's command line, parsed with CLI11 (Debian's libcli11-dev). Every rank parses the
// same argv, so every rank reaches the same verdict; only the rank asked to print does.
#include <CLI/CLI.hpp>

#include <iostream>
#include <optional>
#include <sstream>
#include <string>

#include <gshard/core/error.hpp>

#include "options.hpp"

namespace moe_lm {

/// Parses argv into `options`. Returns std::nullopt to go on, or the exit code when the run
/// should end now (--help: 0; a bad option: nonzero). Output only where `print` (rank 0).
inline std::optional<int> parse_options(Options& options, int argc, char** argv,
                                        bool print = true) {
  CLI::App app{
      "moe_lm: a byte-level multilingual mixture-of-experts language model trained with gshard\n"
      "on Debian's fortune cookies (en de es it ru pl cs zh), balanced across languages.",
      "moe_lm"};
  app.option_defaults()->always_capture_default();
  auto& o = options;
  const auto positive = CLI::PositiveNumber;
  app.add_option("--mesh", o.mesh, "mesh shape: data x expert [x model], e.g. 2x2");
  app.add_option("--d-model", o.d_model, "model width")->check(positive);
  app.add_option("--layers", o.layers, "transformer blocks (every other one is MoE)")
      ->check(positive);
  app.add_option("--heads", o.heads, "attention heads")->check(positive);
  app.add_option("--ffn", o.ffn, "hidden size of the dense and expert FFNs")->check(positive);
  app.add_option("--experts", o.experts, "experts per MoE layer")->check(positive);
  app.add_option("--capacity-factor", o.capacity_factor, "expert capacity factor")->check(positive);
  app.add_option("--routing", o.routing,
                 "capacity: GShard's expert capacity (drops overflow); dropless: every routed "
                 "token computed, exchanged by exact counts")
      ->check(CLI::IsMember({"capacity", "dropless"}));
  app.add_option("--balance", o.balance,
                 "aux: GShard's auxiliary loss; bias: DeepSeek-V3's selection bias, no loss "
                 "term; both")
      ->check(CLI::IsMember({"aux", "bias", "both"}));
  app.add_option("--bias-rate", o.bias_rate, "step of the selection bias per training step")
      ->check(positive);
  app.add_option("--context", o.context, "tokens (bytes) per row")->check(positive);
  app.add_option("--batch", o.batch, "global rows per step")->check(positive);
  app.add_option("--steps", o.steps,
                 "training steps (0: as many as fill --time-limit, fitted at the warmup's end)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--lr", o.lr, "peak learning rate")->check(positive);
  app.add_option("--warmup", o.warmup, "linear warmup steps")->check(CLI::NonNegativeNumber);
  app.add_option("--eval-every", o.eval_every, "steps between held-out evaluations")
      ->check(positive);
  app.add_option("--eval-batches", o.eval_batches, "held-out batches per evaluation")
      ->check(positive);
  app.add_option("--time-limit", o.time_limit, "stop training after this many seconds (0: none)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--checkpoint-dir", o.checkpoint_dir, "where to save checkpoints (empty: none)");
  app.add_option("--seed", o.seed, "seed of the initialisation and of the batch sampler");
  app.add_option("--out", o.out, "output directory for CSV, PNG and sample text");
  app.add_option("--sample-bytes", o.sample_bytes, "bytes of generated text per language")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--trace", o.trace,
                 "write a Chrome trace (Perfetto) of the first --trace-steps training steps, all "
                 "ranks, to this file, and their step plan to <file>.plan.json");
  app.add_option("--trace-steps", o.trace_steps, "training steps to trace")->check(positive);
  std::ostringstream out, err;
  try {
    app.parse(argc, argv);
    o.mesh_shape = parse_mesh(o.mesh);
    if (o.steps == 0 && !(o.time_limit > 0))
      throw CLI::ValidationError("--steps", "--steps 0 fits the steps to --time-limit, which is 0");
    if (o.d_model % o.heads != 0)
      throw CLI::ValidationError("--heads", "--d-model " + std::to_string(o.d_model) +
                                                " must be a multiple of --heads " +
                                                std::to_string(o.heads));
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e, out, err);
    if (print) {
      std::cout << out.str() << std::flush;
      std::cerr << err.str() << std::flush;
    }
    return code;
  } catch (const gshard::Error& e) {
    if (print) std::cerr << e.what() << "\nRun with --help for more information.\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace moe_lm
