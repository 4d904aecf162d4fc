// moe_lm::Trainer's runs of the model (train.hpp): a training step (forward, backward, global-norm
// clipping, AdamW), held-out evaluation and sampling. One file: the model's loss is instantiated
// once for both.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <tuple>
#include <vector>

#include <gshard/autodiff/grad.hpp>
#include <gshard/nn/clip.hpp>

#include "train.hpp"

namespace moe_lm {

StepStats Trainer::step(const Corpus& corpus, std::int64_t step) {
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
  model_.balance_routers(l.stats);
  s.loss = static_cast<double>(l.cross_entropy.to_global()[0]);
  s.aux_loss = static_cast<double>(l.aux_loss.to_global()[0]);
  for (const double d : l.stats.dropped_fraction) s.dropped += d;
  if (!l.stats.dropped_fraction.empty())
    s.dropped /= static_cast<double>(l.stats.dropped_fraction.size());
  s.tokens = b.batch * b.context;
  return s;
}

Evaluation Trainer::evaluate(const Corpus& corpus, std::int64_t rows) const {
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

std::vector<std::string> Trainer::generate(const std::vector<std::string>& prompts, int bytes,
                                           std::uint64_t seed, double temperature) const {
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

}  // namespace moe_lm
