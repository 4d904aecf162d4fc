// moe_lm::Trainer: set-up, batches as tensors, checkpoints and the plan (train.hpp).
#include <algorithm>
#include <cstddef>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <gshard/nn/schedules.hpp>

#include "train.hpp"

namespace moe_lm {

namespace {

std::string pad(std::string text, std::size_t width) {
  if (text.size() < width) text.resize(width, ' ');
  return text + " ";
}

}  // namespace

Trainer::Trainer(const MeshT& mesh, const Options& o)
    : mesh_(mesh),
      options_(o),
      model_(Model::init(mesh, model_config(o), o.seed)),
      optimizer_(gshard::nn::AdamWOptions{
          .learning_rate = gshard::nn::cosine(o.lr, o.warmup, std::max(o.steps, o.warmup + 1), 0.1),
          .beta1 = 0.9,
          .beta2 = 0.98,
          .epsilon = 1e-9,
          .weight_decay = 0.01,
          .decoupled_weight_decay = true}) {}

std::pair<Trainer::Tokens, Trainer::Tokens> Trainer::tensors(const Batch& b) const {
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

Trainer::Bias Trainer::selection_bias_tensor() const {
  std::vector<double> all;
  for (const auto& layer : model_.selection_bias) all.insert(all.end(), layer.begin(), layer.end());
  const auto layers = static_cast<std::int64_t>(model_.selection_bias.size());
  return gshard::from_global<Bias>(mesh_, {layers, model_.config.experts}, all);
}

void Trainer::save(const std::string& path, std::int64_t step,
                   const std::map<std::string, std::string>& metadata) {
  gshard::io::SafetensorsWriter w(mesh_.comm());
  constexpr auto names = Model::param_names();
  auto params = model_.params();
  std::size_t i = 0;
  std::apply([&](const auto&... p) { (w.add("model." + std::string(names[i++]), p), ...); },
             params);
  optimizer_.save(w, params);
  if (!model_.selection_bias.empty()) w.add("router.selection_bias", selection_bias_tensor());
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  w.set_metadata("moe_lm.step", std::to_string(step));
  w.set_metadata("moe_lm.seed", std::to_string(options_.seed));
  w.write(path);
}

std::int64_t Trainer::load(const gshard::io::SafetensorsReader& r) {
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
  model_.selection_bias.clear();
  if (r.contains("router.selection_bias")) {
    const std::int64_t layers = model_.config.moe_layers(), e = model_.config.experts;
    auto t = gshard::zeros<Bias>(mesh_, {layers, e});
    r.read_into("router.selection_bias", t);
    const std::vector<double> all = t.to_global();
    for (std::int64_t l = 0; l < layers; ++l)
      model_.selection_bias.emplace_back(all.begin() + l * e, all.begin() + (l + 1) * e);
  }
  const std::string& text = r.metadata("moe_lm.step");
  if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
    throw gshard::Error("moe_lm::load", "the checkpoint's step \"" + text + "\" is not a number");
  const std::int64_t step = std::stoll(text);
  if (step != optimizer_.steps())
    throw gshard::Error("moe_lm::load", "the checkpoint's step " + std::to_string(step) +
                                            " differs from its optimizer's " +
                                            std::to_string(optimizer_.steps()));
  return step;
}

std::string Trainer::plan() const {
  std::ostringstream s;
  const auto sizes = mesh_.sizes();
  s << "plan: mesh data " << sizes[0] << " x expert " << sizes[1] << " x model " << sizes[2] << " ("
    << mesh_.size() << " ranks); " << model_.parameter_count() << " parameters\n";
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

}  // namespace moe_lm
