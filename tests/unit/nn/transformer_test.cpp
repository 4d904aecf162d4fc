// The Transformer language model (nn/transformer.hpp): causal attention against a naive loop on
// every 2-axis mesh (and a "model" axis splitting heads at 2x2x2), the LM's losses and all
// gradients on every mesh against the same model on one rank, gradients against finite
// differences, and a tiny model learning a repeated sequence with Adam.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/nn/optimizers.hpp>
#include <gshard/nn/transformer.hpp>
#include <gshard/ops/random.hpp>
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "grad_checks.hpp"
#include "moe_reference.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gshard::test::fd_relative_error;
using gshard::test::make;

using DE = gs::Mesh<"data", "expert">;
using DEM = gs::Mesh<"data", "expert", "model">;

DE self_mesh() { return DE(MPI_COMM_SELF, {1, 1}); }

double max_abs(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

// Naive attention on global row-major arrays: x [B][S][M], w* [M][N][D], wo [N][D][M].
std::vector<double> naive_attention(const std::vector<double>& x, const std::vector<double>& wq,
                                    const std::vector<double>& wk, const std::vector<double>& wv,
                                    const std::vector<double>& wo, std::size_t B, std::size_t S,
                                    std::size_t M, std::size_t N, std::size_t D) {
  auto proj = [&](const std::vector<double>& w) {
    std::vector<double> r(B * S * N * D, 0.0);
    for (std::size_t b = 0; b < B; ++b)
      for (std::size_t s = 0; s < S; ++s)
        for (std::size_t n = 0; n < N; ++n)
          for (std::size_t d = 0; d < D; ++d) {
            double acc = 0;
            for (std::size_t m = 0; m < M; ++m)
              acc += x[(b * S + s) * M + m] * w[(m * N + n) * D + d];
            r[((b * S + s) * N + n) * D + d] = acc;
          }
    return r;
  };
  const auto q = proj(wq), k = proj(wk), v = proj(wv);
  std::vector<double> out(B * S * M, 0.0);
  for (std::size_t b = 0; b < B; ++b)
    for (std::size_t n = 0; n < N; ++n)
      for (std::size_t s = 0; s < S; ++s) {
        std::vector<double> sc(s + 1);
        double mx = -1e300;
        for (std::size_t t = 0; t <= s; ++t) {
          double acc = 0;
          for (std::size_t d = 0; d < D; ++d)
            acc += q[((b * S + s) * N + n) * D + d] * k[((b * S + t) * N + n) * D + d];
          sc[t] = acc / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, sc[t]);
        }
        double z = 0;
        for (auto& e : sc) z += (e = std::exp(e - mx));
        for (std::size_t d = 0; d < D; ++d) {
          double o = 0;
          for (std::size_t t = 0; t <= s; ++t) o += sc[t] / z * v[((b * S + t) * N + n) * D + d];
          for (std::size_t m = 0; m < M; ++m)
            out[(b * S + s) * M + m] += o * wo[(n * D + d) * M + m];
        }
      }
  return out;
}

template <class MeshT>
void attention_case(const MeshT& mesh) {
  using Ty = gs::nn::detail::TransformerTypes<double, MeshT>;
  const std::int64_t B = 3, S = 5, M = 4, N = 3, D = 2;
  const auto x = make<typename Ty::X>(mesh, {B, S, M}, 1);
  const auto wq = make<typename Ty::Wqkv>(mesh, {M, N, D}, 2);
  const auto wk = make<typename Ty::Wqkv>(mesh, {M, N, D}, 3);
  const auto wv = make<typename Ty::Wqkv>(mesh, {M, N, D}, 4);
  const auto wo = make<typename Ty::Wout>(mesh, {N, D, M}, 5);
  const auto mask = gs::nn::causal_mask<typename Ty::Mask>(mesh, S);
  gs::comm_counters().reset();
  const auto out = gs::nn::causal_attention(x, wq, wk, wv, wo, mask);
  // Batch-split activations and replicated weights: no communication; heads over "model":
  // one AllReduce over that axis (Megatron's), nothing else.
  if constexpr (MeshT::axis_count == 2) {
    CHECK(gs::comm_counters().total().calls == 0);
  } else {
    CHECK(gs::comm_counters().get("model", gs::Collective::all_reduce).calls == 1);
    CHECK(gs::comm_counters().total().calls == 1);
  }
  const auto got = out.to_global();
  const auto want = naive_attention(x.to_global(), wq.to_global(), wk.to_global(), wv.to_global(),
                                    wo.to_global(), B, S, M, N, D);
  CHECK(max_abs(got, want) < 1e-12);
  // The fused version (the mask built in): the same values and the same communication.
  gs::comm_counters().reset();
  const auto fused_out = gs::nn::causal_attention(x, wq, wk, wv, wo);
  if constexpr (MeshT::axis_count == 2) {
    CHECK(gs::comm_counters().total().calls == 0);
  } else {
    CHECK(gs::comm_counters().get("model", gs::Collective::all_reduce).calls == 1);
    CHECK(gs::comm_counters().total().calls == 1);
  }
  CHECK(max_abs(fused_out.to_global(), want) < 1e-12);

  // Causal: changing the token at position 3 leaves positions 0..2 unchanged, not 3.
  auto xv = x.to_global();
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t m = 0; m < M; ++m) xv[static_cast<std::size_t>((b * S + 3) * M + m)] += 0.7;
  const auto x2 = gs::from_global<typename Ty::X>(mesh, {B, S, M}, xv);
  const auto got2 = gs::nn::causal_attention(x2, wq, wk, wv, wo, mask).to_global();
  double before = 0, at = 0;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s)
      for (std::int64_t m = 0; m < M; ++m) {
        const auto i = static_cast<std::size_t>((b * S + s) * M + m);
        (s < 3 ? before : at) = std::max(s < 3 ? before : at, std::abs(got2[i] - got[i]));
      }
  CHECK(before == 0.0);
  CHECK(at > 1e-3);
}

TEST_CASE("causal attention equals a naive loop on every mesh and is causal") {
  attention_case(self_mesh());
  for (const auto& s : gshard::test::listed_mesh_shapes(gshard::test::world_size())) {
    INFO("mesh " << gshard::test::sizes_text(s));
    if (s.size() == 2) attention_case(DE(MPI_COMM_WORLD, {s[0], s[1]}));
    if (s.size() == 3) attention_case(DEM(MPI_COMM_WORLD, {s[0], s[1], s[2]}));
  }
}

gs::nn::TransformerConfig tiny_config() {
  gs::nn::TransformerConfig c;
  c.vocab = 11;
  c.d_model = 6;
  c.heads = 3;
  c.head_dim = 2;
  c.d_ff = 5;
  c.layers = 2;
  c.max_len = 7;
  c.experts = 3;
  c.expert_hidden = 4;
  c.moe.k = 2;
  c.moe.capacity_factor = 1.0;  // some drops
  c.moe.min_capacity = 1;
  c.moe.second_expert = gs::nn::SecondExpert::random;
  c.aux_loss_weight = 0.1;
  c.z_loss_weight = 0.01;
  return c;
}

template <class Tokens>
Tokens token_tensor(const typename Tokens::mesh_type& mesh, std::int64_t b, std::int64_t s,
                    std::int64_t vocab, std::int64_t salt) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(b * s));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = (static_cast<std::int64_t>(i) * 7 + salt * 3 + static_cast<std::int64_t>(i * i) % 5) %
           vocab;
  return gs::from_global<Tokens>(mesh, {b, s}, v);
}

struct LmResult {
  std::vector<double> losses;  // total, cross-entropy, aux, z
  std::vector<std::vector<double>> grads;
  gs::nn::TransformerStats stats;
};

template <class MeshT, bool Tied>
LmResult lm_run(const MeshT& mesh, const gs::nn::TransformerConfig& c, std::int64_t B,
                std::int64_t S) {
  using Model = gs::nn::TransformerLM<double, MeshT, Tied>;
  Model model = Model::init(mesh, c, 42);
  const auto tokens = token_tensor<typename Model::Tokens>(mesh, B, S, c.vocab, 1);
  const auto targets = token_tensor<typename Model::Tokens>(mesh, B, S, c.vocab, 2);
  gs::track(model.params());
  const auto l = model.loss(tokens, targets, 5);
  LmResult r;
  r.losses = {l.total.to_global()[0], l.cross_entropy.to_global()[0], l.aux_loss.to_global()[0],
              l.z_loss.to_global()[0]};
  r.stats = l.stats;
  const auto g = gs::grad(l.total, model.params());
  std::apply([&](const auto&... gi) { (r.grads.push_back(gi.to_global()), ...); }, g);
  return r;
}

template <bool Tied>
void lm_every_mesh(const gs::nn::TransformerConfig& c) {
  const std::int64_t B = 5, S = 6;  // B uneven on every mesh
  const LmResult want = lm_run<DE, Tied>(self_mesh(), c, B, S);
  REQUIRE(want.stats.dropped_fraction.size() == static_cast<std::size_t>(c.moe_layers()));
  if (c.moe_layers() > 0) CHECK(want.stats.dropped_fraction[0] > 0);  // the capacity binds
  CHECK(want.losses[1] > 1.0);
  for (const auto& s : gshard::test::listed_mesh_shapes(gshard::test::world_size())) {
    INFO("mesh " << gshard::test::sizes_text(s) << " tied " << Tied << " layers " << c.layers
                 << " experts " << c.experts);
    LmResult got;
    if (s.size() == 2) {
      got = lm_run<DE, Tied>(DE(MPI_COMM_WORLD, {s[0], s[1]}), c, B, S);
    } else if constexpr (Tied) {  // heads, hidden units and vocabulary over "model"
      got = lm_run<DEM, Tied>(DEM(MPI_COMM_WORLD, {s[0], s[1], s[2]}), c, B, S);
    } else {
      continue;
    }
    CHECK(max_abs(got.losses, want.losses) < 1e-10);
    CHECK(got.stats.tokens_per_expert == want.stats.tokens_per_expert);
    REQUIRE(got.grads.size() == want.grads.size());
    for (std::size_t i = 0; i < got.grads.size(); ++i) {
      INFO("parameter " << i);
      CHECK(max_abs(got.grads[i], want.grads[i]) < 1e-10);
    }
  }
}

TEST_CASE("LM losses and all gradients on every mesh equal one rank") {
  auto c = tiny_config();
  c.layers = 4;  // two dense and two MoE blocks: every stacked parameter sliced at 0 and 1
  lm_every_mesh<true>(c);
  c.layers = 3;
  lm_every_mesh<false>(c);
  c.experts = 0;  // every block dense; the MoE parameters are empty
  lm_every_mesh<true>(c);
}

TEST_CASE("the cross-entropy equals a naive loop over the logits") {
  using Model = gs::nn::TransformerLM<double, DE, true>;
  const DE mesh(MPI_COMM_WORLD, {1, gshard::test::world_size()});
  const auto c = tiny_config();
  const Model model = Model::init(mesh, c, 3);
  const std::int64_t B = 3, S = 4;
  const auto tokens = token_tensor<Model::Tokens>(mesh, B, S, c.vocab, 1);
  const auto targets = token_tensor<Model::Tokens>(mesh, B, S, c.vocab, 4);
  const auto lg = model.logits(tokens, 5).to_global();
  const auto t = targets.to_global();
  double ce = 0;
  const auto V = static_cast<std::size_t>(c.vocab);
  for (std::size_t i = 0; i < t.size(); ++i) {
    double mx = -1e300, z = 0;
    for (std::size_t v = 0; v < V; ++v) mx = std::max(mx, lg[i * V + v]);
    for (std::size_t v = 0; v < V; ++v) z += std::exp(lg[i * V + v] - mx);
    ce += mx + std::log(z) - lg[i * V + static_cast<std::size_t>(t[i])];
  }
  ce /= static_cast<double>(t.size());
  const auto l = model.loss(tokens, targets, 5);
  CHECK(std::abs(l.cross_entropy.to_global()[0] - ce) < 1e-12);
  const double total = l.cross_entropy.to_global()[0] + 0.1 * l.aux_loss.to_global()[0] +
                       0.01 * l.z_loss.to_global()[0];
  CHECK(std::abs(l.total.to_global()[0] - total) < 1e-12);
  CHECK(l.aux_loss.to_global()[0] > 0.5);
  // Parameter count: every tensor's global size.
  const std::int64_t M = c.d_model, L = c.layers, H = c.head_dim * c.heads;
  const std::int64_t want = c.vocab * M + c.max_len * M + 4 * L * M + 4 * L * M * H +
                            c.d_ff * M * 2 + M * c.experts + 2 * c.experts * M * c.expert_hidden +
                            2 * M;
  CHECK(model.parameter_count() == want);
}

// The whole LM on global vectors: embedding + positions, pre-LN blocks (naive attention, a
// dense FFN in even blocks, the MoE reference loop in odd ones), final LN, tied logits.
std::vector<double> naive_lm(const gs::nn::TransformerConfig& c,
                             const gs::nn::TransformerLM<double, DE, true>& model,
                             const std::vector<std::int64_t>& tok,
                             const std::vector<std::int64_t>& tgt, std::size_t B, std::size_t S,
                             std::uint64_t seed) {
  namespace ref = gshard::test::moe_ref;
  const auto M = static_cast<std::size_t>(c.d_model), N = static_cast<std::size_t>(c.heads),
             D = static_cast<std::size_t>(c.head_dim), F = static_cast<std::size_t>(c.d_ff),
             E = static_cast<std::size_t>(c.experts), H = static_cast<std::size_t>(c.expert_hidden),
             V = static_cast<std::size_t>(c.vocab);
  const auto emb = model.embed.to_global(), pos = model.pos.to_global();
  auto part = [](const std::vector<double>& w, std::size_t l, std::size_t n) {
    return std::vector<double>(w.begin() + static_cast<std::ptrdiff_t>(l * n),
                               w.begin() + static_cast<std::ptrdiff_t>((l + 1) * n));
  };
  auto ln = [&](const std::vector<double>& x, const std::vector<double>& g,
                const std::vector<double>& b) {
    std::vector<double> y(x.size());
    for (std::size_t r = 0; r < x.size() / M; ++r) {
      double mu = 0, var = 0;
      for (std::size_t m = 0; m < M; ++m) mu += x[r * M + m] / static_cast<double>(M);
      for (std::size_t m = 0; m < M; ++m)
        var += (x[r * M + m] - mu) * (x[r * M + m] - mu) / static_cast<double>(M);
      for (std::size_t m = 0; m < M; ++m)
        y[r * M + m] = (x[r * M + m] - mu) / std::sqrt(var + c.ln_eps) * g[m] + b[m];
    }
    return y;
  };
  std::vector<double> x(B * S * M);
  for (std::size_t t = 0; t < B * S; ++t)
    for (std::size_t m = 0; m < M; ++m)
      x[t * M + m] = emb[static_cast<std::size_t>(tok[t]) * M + m] + pos[(t % S) * M + m];
  const auto g1 = model.ln1_g.to_global(), b1 = model.ln1_b.to_global();
  const auto g2 = model.ln2_g.to_global(), b2 = model.ln2_b.to_global();
  const auto wq = model.wq.to_global(), wk = model.wk.to_global(), wv = model.wv.to_global(),
             wo = model.wo.to_global(), fi = model.ffn_wi.to_global(),
             fo = model.ffn_wo.to_global(), rg = model.moe_wg.to_global(),
             ri = model.moe_wi.to_global(), ro = model.moe_wo.to_global();
  double aux = 0, z = 0;
  std::size_t dense_i = 0, moe_i = 0;
  for (std::size_t l = 0; l < static_cast<std::size_t>(c.layers); ++l) {
    const auto h = ln(x, part(g1, l, M), part(b1, l, M));
    const auto a = naive_attention(h, part(wq, l, M * N * D), part(wk, l, M * N * D),
                                   part(wv, l, M * N * D), part(wo, l, M * N * D), B, S, M, N, D);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] += a[i];
    const auto h2 = ln(x, part(g2, l, M), part(b2, l, M));
    if (l % 2 == 1) {
      ref::Problem p;
      p.G = static_cast<ref::Int>(B), p.S = static_cast<ref::Int>(S);
      p.M = static_cast<ref::Int>(M), p.E = static_cast<ref::Int>(E);
      p.H = static_cast<ref::Int>(H);
      p.x = h2, p.wg = part(rg, moe_i, M * E), p.wi = part(ri, moe_i, E * M * H);
      p.wo = part(ro, moe_i, E * H * M);
      ++moe_i;
      const auto u =
          gs::random_uniform<gs::Sharded<double, DE, "G S K">>(
              self_mesh(), {p.G, p.S, 2}, gs::nn::detail::parameter_seed(c.moe.seed ^ seed, l))
              .to_global();
      for (std::size_t t = 0; t < B * S; ++t) p.uniforms.push_back(u[t * 2 + 1]);
      ref::Options o;
      o.k = 2;
      o.capacity_factor = c.moe.capacity_factor;
      o.min_capacity = c.moe.min_capacity;
      o.second_expert_policy = ref::SecondExpertPolicy::random;
      const ref::Result r = ref::moe_layer(p, o);
      for (std::size_t i = 0; i < x.size(); ++i) x[i] += r.out[i];
      aux += r.aux_loss, z += r.router_z;
    } else {
      const auto wi = part(fi, dense_i, M * F), wo2 = part(fo, dense_i, F * M);
      ++dense_i;
      for (std::size_t t = 0; t < B * S; ++t)
        for (std::size_t f = 0; f < F; ++f) {
          double acc = 0;
          for (std::size_t m = 0; m < M; ++m) acc += h2[t * M + m] * wi[m * F + f];
          acc = std::max(acc, 0.0);
          for (std::size_t m = 0; m < M; ++m) x[t * M + m] += acc * wo2[f * M + m];
        }
    }
  }
  const auto hf = ln(x, model.lnf_g.to_global(), model.lnf_b.to_global());
  double ce = 0;
  for (std::size_t t = 0; t < B * S; ++t) {
    std::vector<double> lg(V);
    double mx = -1e300, sum = 0;
    for (std::size_t v = 0; v < V; ++v) {
      for (std::size_t m = 0; m < M; ++m) lg[v] += hf[t * M + m] * emb[v * M + m];
      mx = std::max(mx, lg[v]);
    }
    for (std::size_t v = 0; v < V; ++v) sum += std::exp(lg[v] - mx);
    ce += (mx + std::log(sum) - lg[static_cast<std::size_t>(tgt[t])]) / static_cast<double>(B * S);
  }
  const double lm = static_cast<double>(moe_i);
  return {ce + c.aux_loss_weight * aux / lm + c.z_loss_weight * z / lm, ce, aux / lm, z / lm};
}

TEST_CASE("the LM's losses equal a naive single-rank loop of the whole model") {
  using Model = gs::nn::TransformerLM<double, DE, true>;
  auto c = tiny_config();
  c.layers = 4;
  const std::int64_t B = 3, S = 5;
  const DE mesh(MPI_COMM_WORLD, {1, gshard::test::world_size()});
  Model model = Model::init(mesh, c, 13);
  // Layer-norm parameters away from their init (1, 0), so a mixed-up gain or bias shows.
  model.ln1_g = make<decltype(model.ln1_g)>(mesh, model.ln1_g.shape(), 21);
  model.ln1_b = make<decltype(model.ln1_b)>(mesh, model.ln1_b.shape(), 22);
  model.ln2_g = make<decltype(model.ln2_g)>(mesh, model.ln2_g.shape(), 23);
  model.ln2_b = make<decltype(model.ln2_b)>(mesh, model.ln2_b.shape(), 24);
  model.lnf_g = make<decltype(model.lnf_g)>(mesh, model.lnf_g.shape(), 25);
  model.lnf_b = make<decltype(model.lnf_b)>(mesh, model.lnf_b.shape(), 26);
  const auto tokens = token_tensor<Model::Tokens>(mesh, B, S, c.vocab, 1);
  const auto targets = token_tensor<Model::Tokens>(mesh, B, S, c.vocab, 2);
  const auto l = model.loss(tokens, targets, 9);
  const std::vector<double> got = {l.total.to_global()[0], l.cross_entropy.to_global()[0],
                                   l.aux_loss.to_global()[0], l.z_loss.to_global()[0]};
  const auto want = naive_lm(c, model, tokens.to_global(), targets.to_global(),
                             static_cast<std::size_t>(B), static_cast<std::size_t>(S), 9);
  CHECK(max_abs(got, want) < 1e-10);
  CHECK(l.stats.dropped_fraction.size() == 2);
}

TEST_CASE("LM gradients on one rank equal central finite differences") {
  using Model = gs::nn::TransformerLM<double, DE, false>;
  const DE self = self_mesh();
  auto c = tiny_config();
  c.moe.second_expert = gs::nn::SecondExpert::all;
  const Model base = Model::init(self, c, 7);
  const auto tokens = token_tensor<Model::Tokens>(self, 2, 4, c.vocab, 1);
  const auto targets = token_tensor<Model::Tokens>(self, 2, 4, c.vocab, 2);
  auto loss_of = [&](const decltype(base.wq)& wq, const decltype(base.moe_wi)& wi,
                     const decltype(base.lnf_g)& g, const decltype(base.embed)& e) {
    Model m = base;
    m.wq = wq, m.moe_wi = wi, m.lnf_g = g, m.embed = e;
    return m.loss(tokens, targets, 1).total;
  };
  CHECK(fd_relative_error(loss_of, base.wq.clone(), base.moe_wi.clone(), base.lnf_g.clone(),
                          base.embed.clone()) < 1e-6);
}

template <class MeshT>
std::vector<double> train(const MeshT& mesh, int steps) {
  using Model = gs::nn::TransformerLM<double, MeshT, true>;
  gs::nn::TransformerConfig c;
  c.vocab = 8, c.d_model = 16, c.heads = 2, c.head_dim = 8, c.d_ff = 32, c.layers = 2;
  c.max_len = 8, c.experts = 4, c.expert_hidden = 16;
  c.moe.second_expert = gs::nn::SecondExpert::all;
  Model model = Model::init(mesh, c, 11);
  // A repeated short sequence: "3 1 4 1 5 ..." has ambiguous successors of 1, so positions matter.
  const std::vector<std::int64_t> seq = {3, 1, 4, 1, 5, 2, 6, 0, 7};
  const std::int64_t B = 4, S = 8;
  std::vector<std::int64_t> tv, yv;
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t s = 0; s < S; ++s) {
      tv.push_back(seq[static_cast<std::size_t>(s)]);
      yv.push_back(seq[static_cast<std::size_t>(s + 1)]);
    }
  const auto tokens = gs::from_global<typename Model::Tokens>(mesh, {B, S}, tv);
  const auto targets = gs::from_global<typename Model::Tokens>(mesh, {B, S}, yv);
  gs::nn::Adam adam({.learning_rate = 1e-2});
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    gs::track(model.params());
    const auto l = model.loss(tokens, targets, static_cast<std::uint64_t>(step));
    losses.push_back(l.cross_entropy.to_global()[0]);
    auto g = gs::grad(l.total, model.params());
    adam.step(model.params(), std::apply([](auto&... gi) { return std::tie(gi...); }, g));
  }
  return losses;
}

TEST_CASE("a tiny MoE LM learns a repeated sequence with Adam (1 and 4 ranks)") {
  const int n = gshard::test::world_size();
  if (n != 1 && n != 4) return;
  const auto losses = train(DE(MPI_COMM_WORLD, {n == 4 ? 2 : 1, n == 4 ? 2 : 1}), 100);
  MESSAGE("cross-entropy " << losses.front() << " -> " << losses.back());
  CHECK(losses.front() > 5 * losses.back());
}

}  // namespace
