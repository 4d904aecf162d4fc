#pragma once
// The main job's model and training loop, shared by main.cpp and the tests (determinism across
// runs and meshes, weak scaling): one TransformerLM on a data x expert x model mesh (a 2-axis
// --mesh gets model 1, so one instantiation serves every shape), AdamW with a cosine schedule and
// global-norm clipping, per-language held-out loss and expert load, and sampling.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gshard/gshard.hpp>
#include <gshard/nn/transformer.hpp>

#include "cli.hpp"
#include "corpus.hpp"

namespace moe_lm {

using MeshT = gshard::Mesh<"data", "expert", "model">;

/// The mesh of --mesh: data x expert [x model], model 1 when not given.
inline MeshT make_mesh(const std::vector<int>& shape, MPI_Comm comm = MPI_COMM_WORLD) {
  if (shape.size() < 2 || shape.size() > 3)
    throw gshard::Error("moe_lm::make_mesh", "a mesh shape has 2 or 3 extents");
  return MeshT(comm, {shape[0], shape[1], shape.size() == 3 ? shape[2] : 1});
}

/// The model of the options: head size d_model / heads, dense and expert FFNs of --ffn hidden
/// units, an MoE layer in every other block, GShard's top-2 gating with the random second
/// expert.
inline gshard::nn::TransformerConfig model_config(const Options& o) {
  gshard::nn::TransformerConfig c;
  c.vocab = kVocabulary;
  c.d_model = o.d_model;
  c.heads = o.heads;
  c.head_dim = o.d_model / o.heads;
  c.d_ff = o.ffn;
  c.layers = o.layers;
  c.max_len = o.context;
  c.experts = o.experts;
  c.expert_hidden = o.ffn;
  c.moe.k = 2;
  c.moe.capacity_factor = o.capacity_factor;
  c.moe.second_expert = gshard::nn::SecondExpert::random;
  c.aux_loss_weight = 1e-2;
  // Small tied embedding (GPT-2's 0.02): logits start near 0, the loss near ln 256 = 5.55.
  c.embedding_sd = 0.02;
  return c;
}

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

template <class T = float>
class Trainer {
 public:
  using Model = gshard::nn::TransformerLM<T, MeshT, true>;
  using Tokens = typename Model::Tokens;

  Trainer(const MeshT& mesh, const Options& o)
      : mesh_(mesh),
        options_(o),
        model_(Model::init(mesh, model_config(o), o.seed)),
        optimizer_(gshard::nn::AdamWOptions{
            .learning_rate =
                gshard::nn::cosine(o.lr, o.warmup, std::max(o.steps, o.warmup + 1), 0.1),
            .beta1 = 0.9,
            .beta2 = 0.98,
            .epsilon = 1e-9,
            .weight_decay = 0.01,
            .decoupled_weight_decay = true}) {}

  [[nodiscard]] const Model& model() const { return model_; }
  [[nodiscard]] const MeshT& mesh() const { return mesh_; }

  /// Inputs and targets of a global batch: tokens [0, context) and [1, context] of each row.
  std::pair<Tokens, Tokens> tensors(const Batch& b) const {
    const std::int64_t rows = b.batch, s = b.context;
    std::vector<std::int64_t> x(static_cast<std::size_t>(rows * s)), y(x.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t t = 0; t < s; ++t) {
        x[static_cast<std::size_t>(r * s + t)] = b.token(r, t);
        y[static_cast<std::size_t>(r * s + t)] = b.token(r, t + 1);
      }
    return {gshard::from_global<Tokens>(mesh_, {rows, s}, x),
            gshard::from_global<Tokens>(mesh_, {rows, s}, y)};
  }

  /// One AdamW step on batch `step` of the training split. Collective.
  StepStats step(const Corpus& corpus, std::int64_t step) {
    const Batch b =
        sample_batch(corpus, Split::train, options_.seed, step, options_.batch, options_.context);
    const auto [x, y] = tensors(b);
    auto params = model_.params();
    gshard::track(params);
    const auto l = model_.loss(x, y, static_cast<std::uint64_t>(step));
    auto g = gshard::grad(l.total, params);
    gshard::untrack(params);
    auto grads = std::apply([](auto&... gi) { return std::tie(gi...); }, g);
    StepStats s;
    s.grad_norm = gshard::nn::clip_by_global_norm(grads, 1.0);
    optimizer_.step(params, grads);
    s.loss = static_cast<double>(l.cross_entropy.to_global()[0]);
    s.aux_loss = static_cast<double>(l.aux_loss.to_global()[0]);
    for (const double d : l.stats.dropped_fraction) s.dropped += d;
    if (!l.stats.dropped_fraction.empty())
      s.dropped /= static_cast<double>(l.stats.dropped_fraction.size());
    s.tokens = b.batch * b.context;
    return s;
  }

  /// Held-out cross-entropy per language over `rows` windows each (fixed windows: the same at
  /// every evaluation), their mean, and the expert load per language. Collective.
  Evaluation evaluate(const Corpus& corpus, std::int64_t rows) const {
    gshard::NoGrad no_grad;
    Evaluation e;
    for (int lang = 0; lang < static_cast<int>(corpus.languages.size()); ++lang) {
      const Batch b = sample_language_batch(corpus, Split::held_out, lang, /*seed=*/0x5eed,
                                            /*step=*/0, rows, options_.context);
      const auto [x, y] = tensors(b);
      const auto l = model_.loss(x, y, /*seed=*/0);
      e.per_language.push_back(static_cast<double>(l.cross_entropy.to_global()[0]));
      std::vector<std::int64_t> load(static_cast<std::size_t>(std::max(options_.experts, 1)), 0);
      for (const auto& layer : l.stats.tokens_per_expert)
        for (std::size_t i = 0; i < layer.size() && i < load.size(); ++i) load[i] += layer[i];
      e.load.push_back(std::move(load));
    }
    for (const double v : e.per_language) e.loss += v;
    e.loss /= static_cast<double>(e.per_language.size());
    return e;
  }

  /// `bytes` bytes sampled after each prompt, all prompts in one batch (right-padded: causal
  /// attention keeps a row's last position blind to the padding), temperature `temperature`,
  /// windows of at most --context bytes. Deterministic in `seed`; the same on every rank.
  std::vector<std::string> generate(const std::vector<std::string>& prompts, int bytes,
                                    std::uint64_t seed, double temperature = 0.8) const {
    gshard::NoGrad no_grad;
    std::vector<std::string> text = prompts;
    for (auto& t : text)
      if (t.empty()) t = "\n";
    const auto rows = static_cast<std::int64_t>(text.size());
    const std::int64_t context = options_.context;
    const std::int64_t V = kVocabulary;
    for (int i = 0; i < bytes; ++i) {
      std::int64_t s = 1;
      for (const auto& t : text)
        s = std::max<std::int64_t>(s, std::min<std::int64_t>(t.size(), context));
      std::vector<std::int64_t> ids(static_cast<std::size_t>(rows * s), ' ');
      std::vector<std::int64_t> last(static_cast<std::size_t>(rows));
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::string& t = text[static_cast<std::size_t>(r)];
        const auto n = std::min<std::int64_t>(static_cast<std::int64_t>(t.size()), context);
        const auto from = static_cast<std::int64_t>(t.size()) - n;
        for (std::int64_t j = 0; j < n; ++j)
          ids[static_cast<std::size_t>(r * s + j)] =
              static_cast<unsigned char>(t[static_cast<std::size_t>(from + j)]);
        last[static_cast<std::size_t>(r)] = n - 1;
      }
      const auto x = gshard::from_global<Tokens>(mesh_, {rows, s}, ids);
      const std::vector<T> logits = model_.logits(x, 0).to_global();  // [rows][s][V]
      for (std::int64_t r = 0; r < rows; ++r) {
        const T* row = logits.data() + (r * s + last[static_cast<std::size_t>(r)]) * V;
        double top = row[0];
        for (std::int64_t v = 1; v < V; ++v) top = std::max(top, static_cast<double>(row[v]));
        std::vector<double> p(static_cast<std::size_t>(V));
        double total = 0;
        for (std::int64_t v = 0; v < V; ++v)
          total += p[static_cast<std::size_t>(v)] =
              std::exp((static_cast<double>(row[v]) - top) / temperature);
        std::uint64_t h = detail::mix(seed ^ 0x67656eULL);
        h = detail::mix(h + static_cast<std::uint64_t>(i));
        h = detail::mix(h + static_cast<std::uint64_t>(r));
        double u = static_cast<double>(h >> 11) * 0x1.0p-53 * total;
        std::int64_t pick = V - 1;
        for (std::int64_t v = 0; v < V; ++v) {
          u -= p[static_cast<std::size_t>(v)];
          if (u < 0) {
            pick = v;
            break;
          }
        }
        text[static_cast<std::size_t>(r)] += static_cast<char>(static_cast<unsigned char>(pick));
      }
    }
    for (std::size_t r = 0; r < text.size(); ++r)
      text[r] = text[r].substr(prompts[r].empty() ? 1 : prompts[r].size());
    return text;
  }

  /// Saves the parameters (by name), AdamW's moments and step count, and `metadata` as one
  /// safetensors file, collectively and atomically. The RNG state is the seed and the step: every
  /// random draw (batches, the router's second expert, dropout) is a function of them.
  void save(const std::string& path, std::int64_t step,
            const std::map<std::string, std::string>& metadata) {
    gshard::io::SafetensorsWriter w(mesh_.comm());
    constexpr auto names = Model::param_names();
    auto params = model_.params();
    std::size_t i = 0;
    std::apply([&](const auto&... p) { (w.add("model." + std::string(names[i++]), p), ...); },
               params);
    optimizer_.save(w, params);
    for (const auto& [k, v] : metadata) w.set_metadata(k, v);
    w.set_metadata("moe_lm.step", std::to_string(step));
    w.set_metadata("moe_lm.seed", std::to_string(options_.seed));
    w.write(path);
  }

  /// Loads what save() wrote, on this trainer's mesh (any mesh may have saved it); returns the
  /// step to continue from. The model's shapes and the seed must be the checkpoint's.
  std::int64_t load(const gshard::io::SafetensorsReader& r) {
    if (r.metadata("moe_lm.seed") != std::to_string(options_.seed))
      throw gshard::Error("moe_lm::load", "the checkpoint was trained with seed " +
                                              r.metadata("moe_lm.seed") + ", this run has " +
                                              std::to_string(options_.seed));
    constexpr auto names = Model::param_names();
    auto params = model_.params();
    std::size_t i = 0;
    std::apply([&](auto&... p) { (r.read_into("model." + std::string(names[i++]), p), ...); },
               params);
    optimizer_.load(r, params);
    const std::string& text = r.metadata("moe_lm.step");
    if (text.empty() || text.size() > 18 ||
        text.find_first_not_of("0123456789") != std::string::npos)
      throw gshard::Error("moe_lm::load", "the checkpoint's step \"" + text + "\" is not a number");
    const std::int64_t step = std::stoll(text);
    if (step != optimizer_.steps())
      throw gshard::Error("moe_lm::load", "the checkpoint's step " + std::to_string(step) +
                                              " differs from its optimizer's " +
                                              std::to_string(optimizer_.steps()));
    return step;
  }

  /// The partitioned plan: the mesh, each parameter's layout with its global and per-rank
  /// shapes, and the activations' layouts.
  std::string plan() const {
    std::ostringstream s;
    const auto sizes = mesh_.sizes();
    s << "plan: mesh data " << sizes[0] << " x expert " << sizes[1] << " x model " << sizes[2]
      << " (" << mesh_.size() << " ranks); " << model_.parameter_count() << " parameters\n";
    constexpr auto names = Model::param_names();
    std::size_t i = 0;
    std::apply(
        [&](const auto&... p) {
          ((s << "  " << pad(std::string(names[i++]), 7)
              << pad(std::string("\"").append(p.spec_string()).append("\""), 22) << " global "
              << pad(gshard::detail::shape_string(p.shape()), 18) << " local "
              << gshard::detail::shape_string(p.local_shape()) << "\n"),
           ...);
        },
        model_.params());
    s << "  activations " << Model::X::spec_string() << ", tokens " << Tokens::spec_string()
      << "; MoE groups = sequences, dispatched \"G:data*expert S M\" -> experts \"E:expert ...\""
         " by AllToAll\n";
    return s.str();
  }

 private:
  static std::string pad(std::string text, std::size_t width) {
    if (text.size() < width) text.resize(width, ' ');
    return text + " ";
  }

  MeshT mesh_;
  Options options_;
  Model model_;
  gshard::nn::AdamW optimizer_;
};

}  // namespace moe_lm
