#pragma once
// A decoder-only Transformer language model with GShard's MoE layer in every other block, written
// only with the library's ops (einsum, elementwise, softmax, layer_norm, take, take_along, slice,
// nn::moe), so it is partitioned, differentiated and checked like any user code.
//
//   tokens "B S" (B over data*expert) --take--> "B S M" + positions "S M"
//   block l (pre-LN): x += attn(ln(x)); x += ffn(ln(x)), ffn = MoE when l is odd, else dense
//   final ln, logits "B S V" (tied to the embedding, or an untied "M V"), cross-entropy
//
// Parameters of the blocks are stacked over a leading label L (one slice per layer), so the
// parameter list is a fixed tuple whatever the number of layers (track, grad, optimizers).
// Mesh: any Mesh whose axes include "data" and "expert"; an axis "model" (optional) splits
// heads, the dense FFN's hidden units and the vocabulary (Megatron style).
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../autodiff/grad.hpp"
#include "../core/error.hpp"
#include "../ops/einsum.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/index.hpp"
#include "../ops/normalize.hpp"
#include "../ops/reduce.hpp"
#include "../ops/shape.hpp"
#include "../tensor/creation.hpp"
#include "../tensor/sharded.hpp"
#include "attention.hpp"
#include "moe.hpp"

namespace gshard::nn {

namespace detail {

template <class MeshT>
constexpr int axis_index(std::string_view name) {
  for (std::size_t i = 0; i < MeshT::axis_names.size(); ++i)
    if (MeshT::axis_names[i] == name) return static_cast<int>(i);
  return -1;
}

/// Unsplit dimensions with these labels.
constexpr Layout plain_layout(std::string_view labels) {
  Layout l{};
  l.rank = static_cast<int>(labels.size());
  for (int d = 0; d < l.rank; ++d) l.dims[d].label = labels[static_cast<std::size_t>(d)];
  return l;
}

/// `l` with `axis` appended (minor) to the split of `label`; no change for axis -1.
constexpr Layout with_split(Layout l, char label, int axis) {
  if (axis < 0) return l;
  DimLayout& d = l.dims[l.find(label)];
  d.axes[d.axis_count++] = axis;
  return l;
}

/// The layouts of the model on MeshT: batch over data*expert, experts over expert, and heads,
/// hidden units and vocabulary over model when the mesh has that axis.
template <class T, class MeshT>
struct TransformerTypes {
  static constexpr int data = axis_index<MeshT>("data");
  static constexpr int expert = axis_index<MeshT>("expert");
  static constexpr int model = axis_index<MeshT>("model");
  static constexpr bool axes_ok = [] {
    if constexpr (data >= 0 && expert >= 0)
      return true;
    else
      return sizeof(nn_error::transformer_mesh_needs_data_and_expert_axes<MeshT>) == 0;
  }();
  static_assert(axes_ok);

  static constexpr Layout batch(std::string_view labels) {
    return with_split(with_split(plain_layout(labels), 'B', data), 'B', expert);
  }
  static constexpr Layout on_model(std::string_view labels, char label) {
    return with_split(plain_layout(labels), label, model);
  }
  static constexpr Layout on_expert(std::string_view labels) {
    return with_split(plain_layout(labels), 'E', expert);
  }

  template <Layout L>
  using Of = SpecTensor<T, MeshT, L>;
  template <Layout L>
  using IndexOf = SpecTensor<std::int64_t, MeshT, L>;

  using Scalar = Of<plain_layout("")>;
  using X = Of<batch("BSM")>;                                // activations
  using Scores = Of<with_split(batch("BNST"), 'N', model)>;  // attention probabilities
  using Logits = Of<with_split(batch("BSV"), 'V', model)>;
  using Mask = Of<plain_layout("ST")>;
  using Vector = Of<plain_layout("M")>;      // layer-norm gain and bias
  using Stacked = Of<plain_layout("LM")>;    // one per layer
  using Table = Of<on_model("VM", 'V')>;     // the embedding
  using Unembed = Of<on_model("MV", 'V')>;   // an untied output projection
  using Positions = Of<plain_layout("SM")>;  // learned positions
  using Wqkv = Of<on_model("MND", 'N')>;
  using Wout = Of<on_model("NDM", 'N')>;
  using StackedWqkv = Of<on_model("LMND", 'N')>;
  using StackedWout = Of<on_model("LNDM", 'N')>;
  using StackedWi = Of<on_model("LMH", 'H')>;
  using StackedWo = Of<on_model("LHM", 'H')>;
  using Wi = Of<on_model("MH", 'H')>;
  using Wo = Of<on_model("HM", 'H')>;
  using Router = Of<plain_layout("ME")>;
  using StackedRouter = Of<plain_layout("LME")>;
  using ExpertWi = Of<on_expert("EMH")>;
  using ExpertWo = Of<on_expert("EHM")>;
  using StackedExpertWi = Of<with_split(plain_layout("LEMH"), 'E', expert)>;
  using StackedExpertWo = Of<with_split(plain_layout("LEHM"), 'E', expert)>;
};

inline std::uint64_t parameter_seed(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace detail

/// The causal mask "S T": 0 where t <= s, `negative` (a large negative number) where t > s.
/// Replicated; built on the host, no communication.
template <class Mask>
Mask causal_mask(const typename Mask::mesh_type& mesh, std::int64_t s, double negative = -1e9) {
  std::vector<typename Mask::value_type> v(static_cast<std::size_t>(s * s));
  for (std::int64_t i = 0; i < s; ++i)
    for (std::int64_t t = i + 1; t < s; ++t)
      v[static_cast<std::size_t>(i * s + t)] = static_cast<typename Mask::value_type>(negative);
  return from_global<Mask>(mesh, {s, s}, v);
}

/// Causal multi-head self-attention: x "B S M", wq/wk/wv "M N D", wo "N D M", mask "S T"
/// (causal_mask). q, k, v = x w; scores "B N S T" = q k / sqrt(D) + mask; softmax over T; the
/// weighted sum of v, projected back to "B S M" in x's type (heads split over an axis leave
/// a partial sum that this conversion finishes: one AllReduce, as in Megatron).
template <class X, class Wq, class Wk, class Wv, class Wo, class Mask>
X causal_attention(const X& x, const Wq& wq, const Wk& wk, const Wv& wv, const Wo& wo,
                   const Mask& mask) {
  const std::int64_t d = wq.shape()[static_cast<std::size_t>(Wq::layout.find('D'))];
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto q = einsum<"BSM,MND->BSND">(x, wq).eval();
  const auto k = einsum<"BSM,MND->BSND">(x, wk).eval().template as<"BTND">();
  const auto v = einsum<"BSM,MND->BSND">(x, wv).eval().template as<"BTND">();
  const auto scores = (einsum<"BSND,BTND->BNST">(q, k) * scale + mask).eval();
  const auto p = softmax<"T">(scores);
  return X(einsum<"BSND,NDM->BSM">(einsum<"BNST,BTND->BSND">(p, v), wo));
}

/// causal_attention with the causal mask built in, through the fused
/// scaled_dot_product_attention (nn/attention.hpp): the same values as with causal_mask, without
/// the "B N S T" einsums, the mask sum and the separate softmax.
template <class X, class Wq, class Wk, class Wv, class Wo>
X causal_attention(const X& x, const Wq& wq, const Wk& wk, const Wv& wv, const Wo& wo) {
  const auto q = einsum<"BSM,MND->BSND">(x, wq).eval();
  const auto k = einsum<"BSM,MND->BSND">(x, wk).eval().template as<"BTND">();
  const auto v = einsum<"BSM,MND->BSND">(x, wv).eval().template as<"BTND">();
  const auto o = scaled_dot_product_attention(q, k, v, {.causal = true});
  return X(einsum<"BSND,NDM->BSM">(o, wo));
}

/// Sizes and options of the language model.
struct TransformerConfig {
  std::int64_t vocab = 256;
  std::int64_t d_model = 64;
  std::int64_t heads = 4;
  std::int64_t head_dim = 16;
  std::int64_t d_ff = 128;           // dense blocks' hidden units
  std::int64_t layers = 2;           // blocks; block l is MoE when l is odd (and experts > 0)
  std::int64_t max_len = 128;        // learned positions
  std::int64_t experts = 4;          // 0: every block dense
  std::int64_t expert_hidden = 128;  // experts' hidden units
  MoeOptions moe{};                  // moe.seed is mixed with the seed given to loss()
  double aux_loss_weight = 1e-2;     // total = cross_entropy + w_aux aux + w_z z
  double z_loss_weight = 0.0;
  double ln_eps = 1e-5;
  double embedding_sd = 0;  // init sd of the embedding and positions; 0: 1/sqrt(d_model)
  // DeepSeek-V3's balancing without a loss term: each MoE block's selection bias moves by this
  // rate per balance_routers() call (after each step); 0: off (set aux_loss_weight to 0 to
  // balance by the bias alone).
  double bias_rate = 0.0;

  [[nodiscard]] std::int64_t moe_layers() const { return experts > 0 ? layers / 2 : 0; }
  [[nodiscard]] std::int64_t dense_layers() const { return layers - moe_layers(); }
};

/// Per forward pass: the MoE layers' statistics, in block order.
struct TransformerStats {
  std::vector<std::vector<std::int64_t>> tokens_per_expert;
  std::vector<double> dropped_fraction;
  std::int64_t capacity = 0;
};

/// loss(): total = cross_entropy + aux_loss_weight aux_loss + z_loss_weight z_loss. Cross-entropy
/// in mean nats per token; aux_loss and z_loss (the routers') averaged over the MoE layers
/// (zero without MoE layers). All rank-0 tensors, differentiable.
template <class Scalar>
struct TransformerLoss {
  Scalar total;
  Scalar cross_entropy;
  Scalar aux_loss;
  Scalar z_loss;
  TransformerStats stats;
};

/// The decoder-only language model. T: float or double; MeshT: axes include "data" and
/// "expert" (optionally "model"); Tied: logits through the embedding table (else a separate
/// "M V" projection).
template <class T, class MeshT, bool Tied = true>
struct TransformerLM {
  using Types = detail::TransformerTypes<T, MeshT>;
  using X = typename Types::X;
  using Scalar = typename Types::Scalar;
  using Mask = typename Types::Mask;
  using Tokens = typename Types::template IndexOf<Types::batch("BS")>;
  using Logits = typename Types::Logits;  // "B S V", V over model

  TransformerConfig config;
  typename Types::Table embed;    // "V M"
  typename Types::Positions pos;  // "S M", max_len positions
  typename Types::Stacked ln1_g;  // "L M", every block
  typename Types::Stacked ln1_b;
  typename Types::StackedWqkv wq;  // "L M N D"
  typename Types::StackedWqkv wk;
  typename Types::StackedWqkv wv;
  typename Types::StackedWout wo;  // "L N D M"
  typename Types::Stacked ln2_g;
  typename Types::Stacked ln2_b;
  typename Types::StackedWi ffn_wi;        // "L M H", dense blocks (even l)
  typename Types::StackedWo ffn_wo;        // "L H M"
  typename Types::StackedRouter moe_wg;    // "L M E", MoE blocks (odd l)
  typename Types::StackedExpertWi moe_wi;  // "L E M H"
  typename Types::StackedExpertWo moe_wo;  // "L E H M"
  typename Types::Vector lnf_g;            // final layer norm
  typename Types::Vector lnf_b;
  typename Types::Unembed out;  // "M V": untied only (empty {0, 0} when tied)
  // Not parameters: each MoE block's selection bias (MoeOptions::selection_bias), E values the
  // same on every rank, moved by balance_routers(); empty until the first call.
  std::vector<std::vector<double>> selection_bias{};

  /// Scaled normal init from a seed (bitwise the same on every mesh): weights N(0, 1/fan_in),
  /// embedding and positions N(0, embedding_sd^2) (default 1/d_model), layer-norm gains 1 and
  /// biases 0.
  static TransformerLM init(const MeshT& mesh, const TransformerConfig& c, std::uint64_t seed) {
    if (c.vocab < 1 || c.d_model < 1 || c.heads < 1 || c.head_dim < 1 || c.d_ff < 1 ||
        c.layers < 1 || c.max_len < 1 || c.experts < 0 || (c.experts > 0 && c.expert_hidden < 1))
      throw Error("TransformerLM",
                  "every size must be positive (experts may be 0): vocab " +
                      std::to_string(c.vocab) + ", d_model " + std::to_string(c.d_model) +
                      ", heads " + std::to_string(c.heads) + ", head_dim " +
                      std::to_string(c.head_dim) + ", d_ff " + std::to_string(c.d_ff) +
                      ", layers " + std::to_string(c.layers) + ", max_len " +
                      std::to_string(c.max_len) + ", experts " + std::to_string(c.experts));
    std::uint64_t next = 0;
    auto normal = [&]<class P>(Shape shape, std::int64_t fan_in, double sd_given = 0) {
      const double sd = sd_given > 0 ? sd_given : 1.0 / std::sqrt(static_cast<double>(fan_in));
      return random_normal<P>(mesh, std::move(shape), detail::parameter_seed(seed, next++), T(0),
                              static_cast<T>(sd));
    };
    const std::int64_t L = c.layers, Ld = c.dense_layers(), Lm = c.moe_layers();
    const std::int64_t M = c.d_model, N = c.heads, D = c.head_dim, E = c.experts;
    TransformerLM m{
        c,
        normal.template operator()<typename Types::Table>({c.vocab, M}, M, c.embedding_sd),
        normal.template operator()<typename Types::Positions>({c.max_len, M}, M, c.embedding_sd),
        full<typename Types::Stacked>(mesh, {L, M}, T(1)),
        zeros<typename Types::Stacked>(mesh, {L, M}),
        normal.template operator()<typename Types::StackedWqkv>({L, M, N, D}, M),
        normal.template operator()<typename Types::StackedWqkv>({L, M, N, D}, M),
        normal.template operator()<typename Types::StackedWqkv>({L, M, N, D}, M),
        normal.template operator()<typename Types::StackedWout>({L, N, D, M}, N * D),
        full<typename Types::Stacked>(mesh, {L, M}, T(1)),
        zeros<typename Types::Stacked>(mesh, {L, M}),
        normal.template operator()<typename Types::StackedWi>({Ld, M, c.d_ff}, M),
        normal.template operator()<typename Types::StackedWo>({Ld, c.d_ff, M}, c.d_ff),
        normal.template operator()<typename Types::StackedRouter>({Lm, M, E}, M),
        normal.template operator()<typename Types::StackedExpertWi>({Lm, E, M, c.expert_hidden}, M),
        normal.template operator()<typename Types::StackedExpertWo>({Lm, E, c.expert_hidden, M},
                                                                    c.expert_hidden),
        full<typename Types::Vector>(mesh, {M}, T(1)),
        zeros<typename Types::Vector>(mesh, {M}),
        Tied ? zeros<typename Types::Unembed>(mesh, {0, 0})
             : normal.template operator()<typename Types::Unembed>({M, c.vocab}, M)};
    return m;
  }

  /// Every parameter, as references (for track, grad and optimizer steps).
  auto params() { return params_of(*this); }
  auto params() const { return params_of(*this); }

  /// The parameters' names, in params() order.
  static constexpr auto param_names() {
    constexpr std::array<std::string_view, 18> all = {
        "embed", "pos",    "ln1_g",  "ln1_b",  "wq",     "wk",     "wv",    "wo",    "ln2_g",
        "ln2_b", "ffn_wi", "ffn_wo", "moe_wg", "moe_wi", "moe_wo", "lnf_g", "lnf_b", "out"};
    std::array<std::string_view, Tied ? 17 : 18> names{};
    for (std::size_t i = 0; i < names.size(); ++i) names[i] = all[i];
    return names;
  }

  /// Moves each MoE block's selection bias toward balance from a step's statistics (its
  /// tokens_per_expert: kept assignments, global), when config.bias_rate > 0.
  void balance_routers(const TransformerStats& stats) {
    if (!(config.bias_rate > 0)) return;
    selection_bias.resize(stats.tokens_per_expert.size());
    for (std::size_t i = 0; i < stats.tokens_per_expert.size(); ++i)
      balance_selection_bias(selection_bias[i], stats.tokens_per_expert[i], config.bias_rate);
  }

  /// Global number of parameter values.
  [[nodiscard]] std::int64_t parameter_count() const {
    return std::apply([](const auto&... p) { return (std::int64_t{0} + ... + p.size()); },
                      params());
  }

  /// The final hidden states "B S M" (after the last layer norm) and the MoE losses.
  /// `seed` varies the routers' randomness (second-expert policy, jitter): pass the step.
  template <class Ids>
  X hidden(const Ids& tokens, std::uint64_t seed, std::optional<Scalar>* aux_sum,
           std::optional<Scalar>* z_sum, TransformerStats* stats,
           std::source_location where = std::source_location::current()) const {
    const gshard::detail::UserSite site(where, "TransformerLM::hidden");
    const std::int64_t s = tokens.shape()[1];
    if (s > config.max_len)
      throw Error("TransformerLM", "sequences of " + std::to_string(s) + " tokens (\"" +
                                       std::string(Ids::spec.view()) + "\" of global shape " +
                                       gshard::detail::shape_string(tokens.shape()) +
                                       ") exceed max_len " + std::to_string(config.max_len));
    const X emb = reshard<X>(take<"V">(embed, tokens));
    return blocks(s == config.max_len ? X(emb + pos) : X(emb + slice<"S">(pos, 0, s)), seed,
                  aux_sum, z_sum, stats);
  }

  /// Logits "B S V" for tokens "B S" (int32 or int64, B over data*expert).
  template <class Ids>
  Logits logits(const Ids& tokens, std::uint64_t seed = 0,
                std::source_location where = std::source_location::current()) const {
    const gshard::detail::UserSite site(where, "TransformerLM::logits");
    std::optional<Scalar> aux, z;
    return project(hidden(tokens, seed, &aux, &z, nullptr));
  }

  /// The loss of predicting targets "B S" from tokens "B S" (both int, laid out like Tokens).
  /// Collective over the mesh.
  template <class Ids, class Targets>
  TransformerLoss<Scalar> loss(const Ids& tokens, const Targets& targets, std::uint64_t seed = 0,
                               std::source_location where = std::source_location::current()) const {
    const gshard::detail::UserSite site(where, "TransformerLM::loss");
    if (tokens.shape() != targets.shape())
      throw Error("TransformerLM::loss",
                  "tokens \"" + std::string(Ids::spec.view()) + "\" of global shape " +
                      gshard::detail::shape_string(tokens.shape()) + " and targets \"" +
                      std::string(Targets::spec.view()) + "\" of global shape " +
                      gshard::detail::shape_string(targets.shape()) + " differ");
    TransformerStats stats;
    std::optional<Scalar> aux, z;
    const Logits lg = project(hidden(tokens, seed, &aux, &z, &stats));
    if constexpr (std::is_same_v<Targets, Tokens>)
      return loss_of(lg, targets, aux, z, std::move(stats));
    else
      return loss_of_any(lg, targets, aux, z, std::move(stats));
  }

  // The forward pass in pieces, each a non-template member defined below the class (not
  // inline): a program may compile them in its own translation units by explicit instantiation
  // (`extern template struct TransformerLM<...>;`, examples/moe_lm/model.hpp).

  /// Block l's attention half, pre-LN: x + causal_attention(layer_norm(x)).
  X attention_block(const X& x, std::int64_t l) const;
  /// Block l's dense feed-forward half (the i-th dense block): x + ffn(layer_norm(x)).
  X dense_block(const X& x, std::int64_t l, std::int64_t i) const;
  /// Block l's MoE half (the i-th MoE block): x + moe(layer_norm(x)); adds the router's losses
  /// to *aux_sum and *z_sum and its statistics to *stats (when not null).
  X moe_block(const X& x, std::int64_t l, std::int64_t i, std::uint64_t seed,
              std::optional<Scalar>* aux_sum, std::optional<Scalar>* z_sum,
              TransformerStats* stats) const;
  /// moe_block's stages: the router of block l (the i-th MoE block) on its normalized input
  /// "G S M" (a sequence per group), and x + the experts' output.
  using Groups = decltype(std::declval<const X&>().template as<"GSM">());
  using Routing = detail::MoeRouting<Groups>;
  Routing router_block(const Groups& h, std::int64_t l, std::int64_t i, std::uint64_t seed) const;
  X experts_block(const X& x, const Groups& h, const Routing& r, std::int64_t i) const;
  /// Every block, then the final layer norm, from the embedded input "B S M".
  X blocks(X x, std::uint64_t seed, std::optional<Scalar>* aux_sum, std::optional<Scalar>* z_sum,
           TransformerStats* stats) const;
  /// Logits "B S V" of hidden states "B S M".
  Logits project(const X& h) const;
  /// loss()'s result from the logits, targets laid out like Tokens and the summed router losses.
  TransformerLoss<Scalar> loss_of(const Logits& lg, const Tokens& targets,
                                  const std::optional<Scalar>& aux_sum,
                                  const std::optional<Scalar>& z_sum, TransformerStats stats) const;

 private:
  template <class Self>
  static auto params_of(Self& m) {
    auto common =
        std::tie(m.embed, m.pos, m.ln1_g, m.ln1_b, m.wq, m.wk, m.wv, m.wo, m.ln2_g, m.ln2_b,
                 m.ffn_wi, m.ffn_wo, m.moe_wg, m.moe_wi, m.moe_wo, m.lnf_g, m.lnf_b);
    if constexpr (Tied)
      return common;
    else
      return std::tuple_cat(common, std::tie(m.out));
  }

  // Block l's layer norm of x, with its row of the stacked gains and biases "L M".
  X block_norm(const X& x, const typename Types::Stacked& gain, const typename Types::Stacked& bias,
               std::int64_t l) const {
    const typename Types::Vector g = einsum<"LM->M">(slice<"L">(gain, l, l + 1));
    const typename Types::Vector b = einsum<"LM->M">(slice<"L">(bias, l, l + 1));
    return layer_norm<"M">(x, g, b, config.ln_eps);
  }

  // The MoE layer's options in block l: the config's, with the routing seed of the step and block.
  MoeOptions moe_options(std::int64_t l, std::uint64_t seed) const {
    MoeOptions opt = config.moe;
    opt.seed = detail::parameter_seed(config.moe.seed ^ seed, static_cast<std::uint64_t>(l));
    return opt;
  }

  template <class Targets>
  TransformerLoss<Scalar> loss_of_any(const Logits& lg, const Targets& targets,
                                      const std::optional<Scalar>& aux_sum,
                                      const std::optional<Scalar>& z_sum,
                                      TransformerStats stats) const {
    // Stable: logsumexp over V minus the target's logit.
    const auto lse = logsumexp<"V">(lg);
    const auto picked = take_along<"V">(lg, targets);
    const Scalar ce = reshard<Scalar>(mean<"BS">(lse - picked));
    const std::int64_t lm = config.moe_layers();
    const MeshT& mesh = embed.mesh();
    const Scalar aux_mean =
        lm > 0 ? Scalar(*aux_sum * (1.0 / static_cast<double>(lm))) : zeros<Scalar>(mesh, {});
    const Scalar z_mean =
        lm > 0 ? Scalar(*z_sum * (1.0 / static_cast<double>(lm))) : zeros<Scalar>(mesh, {});
    const Scalar total = ce + aux_mean * config.aux_loss_weight + z_mean * config.z_loss_weight;
    return {total, ce, aux_mean, z_mean, std::move(stats)};
  }
};

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::attention_block(const X& x, std::int64_t l) const -> X {
  using Ty = Types;
  const X h = block_norm(x, ln1_g, ln1_b, l);
  const typename Ty::Wqkv q = einsum<"LMND->MND">(slice<"L">(wq, l, l + 1));
  const typename Ty::Wqkv k = einsum<"LMND->MND">(slice<"L">(wk, l, l + 1));
  const typename Ty::Wqkv v = einsum<"LMND->MND">(slice<"L">(wv, l, l + 1));
  const typename Ty::Wout o = einsum<"LNDM->NDM">(slice<"L">(wo, l, l + 1));
  return X(x + causal_attention(h, q, k, v, o));
}

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::dense_block(const X& x, std::int64_t l, std::int64_t i) const
    -> X {
  using Ty = Types;
  const X h = block_norm(x, ln2_g, ln2_b, l);
  const typename Ty::Wi wi = einsum<"LMH->MH">(slice<"L">(ffn_wi, i, i + 1));
  const typename Ty::Wo wo2 = einsum<"LHM->HM">(slice<"L">(ffn_wo, i, i + 1));
  return X(x + einsum<"BSH,HM->BSM">(relu(einsum<"BSM,MH->BSH">(h, wi)), wo2));
}

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::moe_block(const X& x, std::int64_t l, std::int64_t i,
                                              std::uint64_t seed, std::optional<Scalar>* aux_sum,
                                              std::optional<Scalar>* z_sum,
                                              TransformerStats* stats) const -> X {
  // Each sequence is one group: G takes B's axes (all devices).
  const Groups h = block_norm(x, ln2_g, ln2_b, l).template as<"GSM">();
  const Routing r = router_block(h, l, i, seed);
  const X y = experts_block(x, h, r, i);
  const auto [aux_partial, z_partial] = detail::moe_losses(r);
  const auto aux = reshard<Scalar>(aux_partial);  // finishes the partial sums: AllReduce
  const auto z = reshard<Scalar>(z_partial);
  *aux_sum = aux_sum->has_value() ? Scalar(**aux_sum + aux) : aux;
  *z_sum = z_sum->has_value() ? Scalar(**z_sum + z) : z;
  if (stats) {
    stats->tokens_per_expert.push_back(r.tokens_per_expert);
    stats->dropped_fraction.push_back(r.dropped_fraction);
    stats->capacity = r.capacity;
  }
  return y;
}

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::router_block(const Groups& h, std::int64_t l, std::int64_t i,
                                                 std::uint64_t seed) const -> Routing {
  const typename Types::Router wg = einsum<"LME->ME">(slice<"L">(moe_wg, i, i + 1));
  MoeOptions opt = moe_options(l, seed);
  if (static_cast<std::size_t>(i) < selection_bias.size())
    opt.selection_bias = selection_bias[static_cast<std::size_t>(i)];
  return detail::moe_route(h, wg, opt);
}

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::experts_block(const X& x, const Groups& h, const Routing& r,
                                                  std::int64_t i) const -> X {
  const typename Types::ExpertWi wi = einsum<"LEMH->EMH">(slice<"L">(moe_wi, i, i + 1));
  const typename Types::ExpertWo wo2 = einsum<"LEHM->EHM">(slice<"L">(moe_wo, i, i + 1));
  const Groups y = detail::moe_experts(h, r, wi, wo2, config.moe);
  return X(x + y.template as<"BSM">());
}

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::blocks(X x, std::uint64_t seed, std::optional<Scalar>* aux_sum,
                                           std::optional<Scalar>* z_sum,
                                           TransformerStats* stats) const -> X {
  std::int64_t dense_i = 0, moe_i = 0;
  for (std::int64_t l = 0; l < config.layers; ++l) {
    x = attention_block(x, l);
    x = l % 2 == 1 && config.experts > 0 ? moe_block(x, l, moe_i++, seed, aux_sum, z_sum, stats)
                                         : dense_block(x, l, dense_i++);
  }
  return X(layer_norm<"M">(x, lnf_g, lnf_b, config.ln_eps));
}

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::project(const X& h) const -> Logits {
  if constexpr (Tied)
    return einsum<"BSM,VM->BSV">(h, embed).eval();
  else
    return einsum<"BSM,MV->BSV">(h, out).eval();
}

template <class T, class MeshT, bool Tied>
auto TransformerLM<T, MeshT, Tied>::loss_of(const Logits& lg, const Tokens& targets,
                                            const std::optional<Scalar>& aux_sum,
                                            const std::optional<Scalar>& z_sum,
                                            TransformerStats stats) const
    -> TransformerLoss<Scalar> {
  return loss_of_any(lg, targets, aux_sum, z_sum, std::move(stats));
}

}  // namespace gshard::nn
