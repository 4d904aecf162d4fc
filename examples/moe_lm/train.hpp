#pragma once
// The main job's training loop, shared by main.cpp and the tests (determinism across runs and
// meshes, weak scaling): the model of model.hpp, AdamW with a cosine schedule and global-norm
// clipping, per-language held-out loss and expert load, and sampling. The members are compiled in
// trainer.cpp (set-up, checkpoints, plan) and trainer_run.cpp (step, evaluation, sampling).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gshard/io/safetensors.hpp>
#include <gshard/nn/optimizers.hpp>

#include "corpus.hpp"
#include "model.hpp"
#include "options.hpp"

namespace moe_lm {

/// One training step's numbers (the same on every rank).
struct StepStats {
  double loss = 0;  // cross-entropy, nats per byte
  double aux_loss = 0;
  double dropped = 0;  // mean over MoE layers
  double grad_norm = 0;
  std::int64_t tokens = 0;
};

/// Held-out loss per language and its balanced mean; expert load when asked for.
struct Evaluation {
  double loss = 0;
  std::vector<double> per_language;
  // [language][expert]: kept assignments, summed over MoE layers.
  std::vector<std::vector<std::int64_t>> load;
};

class Trainer {
 public:
  using T = float;
  using Tokens = Model::Tokens;

  Trainer(const MeshT& mesh, const Options& o);

  [[nodiscard]] const Model& model() const { return model_; }
  [[nodiscard]] const MeshT& mesh() const { return mesh_; }

  /// Inputs and targets of a global batch: tokens [0, context) and [1, context] of each row.
  std::pair<Tokens, Tokens> tensors(const Batch& b) const;

  /// One AdamW step on batch `step` of the training split. Collective.
  StepStats step(const Corpus& corpus, std::int64_t step);

  /// Held-out cross-entropy per language over `rows` windows each (fixed windows: the same at
  /// every evaluation), their mean, and the expert load per language. Collective.
  Evaluation evaluate(const Corpus& corpus, std::int64_t rows) const;

  /// `bytes` bytes sampled after each prompt, all prompts in one batch (right-padded: causal
  /// attention keeps a row's last position blind to the padding), temperature `temperature`,
  /// windows of at most --context bytes. Deterministic in `seed`; the same on every rank.
  std::vector<std::string> generate(const std::vector<std::string>& prompts, int bytes,
                                    std::uint64_t seed, double temperature = 0.8) const;

  /// Saves the parameters (by name), AdamW's moments and step count, the routers' selection
  /// biases (when bias balancing has moved them), and `metadata` as one
  /// safetensors file, collectively and atomically. The RNG state is the seed and the step: every
  /// random draw (batches, the router's second expert, dropout) is a function of them.
  void save(const std::string& path, std::int64_t step,
            const std::map<std::string, std::string>& metadata);

  /// Loads what save() wrote, on this trainer's mesh (any mesh may have saved it); returns the
  /// step to continue from. The model's shapes and the seed must be the checkpoint's.
  std::int64_t load(const gshard::io::SafetensorsReader& r);

  /// The total step count the cosine schedule decays over (--steps, or fitted to the time limit
  /// with --steps 0: set before the warmup ends). Saved with checkpoints.
  void set_total_steps(std::int64_t total);
  [[nodiscard]] std::int64_t total_steps() const { return *total_steps_; }

  /// The partitioned plan: the mesh, each parameter's layout with its global and per-rank
  /// shapes, and the activations' layouts.
  std::string plan() const;

 private:
  // The routers' selection biases "L E" (replicated, double), for checkpoints.
  using Bias = gshard::Sharded<double, MeshT, "L E">;
  [[nodiscard]] Bias selection_bias_tensor() const;

  MeshT mesh_;
  Options options_;
  Model model_;
  std::shared_ptr<std::int64_t> total_steps_;  // read by the schedule at every step
  gshard::nn::AdamW optimizer_;
};

}  // namespace moe_lm
