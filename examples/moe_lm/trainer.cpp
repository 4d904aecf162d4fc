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
      // --steps 0: no decay until the count is fitted (at the warmup's end, main.cpp).
      total_steps_(std::make_shared<std::int64_t>(o.steps > 0 ? std::max(o.steps, o.warmup + 1)
                                                              : std::int64_t{1} << 40)),
      optimizer_(gshard::nn::AdamWOptions{
          .learning_rate =
              [total = total_steps_, peak = o.lr, warmup = std::int64_t{o.warmup}](std::int64_t t) {
                return gshard::nn::cosine(peak, warmup, *total, 0.1)(t);
              },
          .beta1 = 0.9,
          .beta2 = 0.98,
          .epsilon = 1e-9,
          .weight_decay = 0.01,
          .decoupled_weight_decay = true}) {}

void Trainer::set_total_steps(std::int64_t total) {
  if (total <= options_.warmup)
    throw gshard::Error("moe_lm::Trainer", "total steps " + std::to_string(total) +
                                               " must exceed the warmup's " +
                                               std::to_string(options_.warmup));
  *total_steps_ = total;
}

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
  w.set_metadata("moe_lm.total_steps", std::to_string(*total_steps_));
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
  if (options_.steps == 0 && r.metadata().count("moe_lm.total_steps") != 0)
    set_total_steps(std::stoll(r.metadata("moe_lm.total_steps")));
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
