#pragma once
// What the MoE layer's tests share: a problem's shapes and routing policy, its inputs on a mesh,
// the layer's options for it and the naive loops' result (moe_reference.hpp) on the same values.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gshard/nn/moe.hpp>
#include <gshard/ops/random.hpp>

#include "grad_checks.hpp"
#include "moe_reference.hpp"

namespace gshard::test::moe_cases {

struct Case {
  std::int64_t g, s, m, e, h;
  int k;
  double capacity_factor;  // E: C = S, nothing dropped
  nn::SecondExpert policy;
  bool fd = false;  // also check gradients by finite differences
};

/// x, wg, wi, wo of `c`'s shapes in TT's layouts (TT::X, Wg, Wi, Wo), fixed seeds.
template <class TT>
struct Inputs {
  typename TT::X x;
  typename TT::Wg wg;
  typename TT::Wi wi;
  typename TT::Wo wo;
  template <class M>
  Inputs(const M& mesh, const Case& c)
      : x(make<typename TT::X>(mesh, {c.g, c.s, c.m}, 1)),
        wg(make<typename TT::Wg>(mesh, {c.m, c.e}, 2)),
        wi(make<typename TT::Wi>(mesh, {c.e, c.m, c.h}, 3)),
        wo(make<typename TT::Wo>(mesh, {c.e, c.h, c.m}, 4)) {}
};

inline nn::MoeOptions options(const Case& c, bool dropless = false, bool dense = false) {
  nn::MoeOptions o{.k = c.k,
                   .capacity_factor = c.capacity_factor,
                   .min_capacity = 1,
                   .second_expert = c.policy,
                   .jitter = 0,
                   .seed = 7,
                   .dense = dense};
  o.dropless = dropless;
  return o;
}

/// The reference's options for the layer's `options(c)`, with `bias` for the choices.
inline moe_ref::Options reference_options(const Case& c, std::vector<double> bias = {}) {
  moe_ref::Options o;
  o.k = c.k;
  o.capacity_factor = c.capacity_factor;
  o.min_capacity = 1;
  o.normalize_gates = c.k >= 2;
  o.second_expert_policy = c.policy == nn::SecondExpert::all ? moe_ref::SecondExpertPolicy::all
                           : c.policy == nn::SecondExpert::random
                               ? moe_ref::SecondExpertPolicy::random
                               : moe_ref::SecondExpertPolicy::sampling;
  o.selection_bias = std::move(bias);
  return o;
}

/// `in`'s global values as the reference's problem, with the uniforms the layer draws (seed 7,
/// per (g, s, choice); the reference takes the second choice's).
template <class M, class In>
moe_ref::Problem problem(const M& mesh, const In& in, const Case& c) {
  moe_ref::Problem p;
  p.G = c.g, p.S = c.s, p.M = c.m, p.E = c.e, p.H = c.h;
  p.x = in.x.to_global(), p.wg = in.wg.to_global(), p.wi = in.wi.to_global();
  p.wo = in.wo.to_global();
  const auto u = random_uniform<Sharded<double, M, "G S K">>(mesh, {c.g, c.s, c.k}, 7).to_global();
  p.uniforms.resize(static_cast<std::size_t>(c.g * c.s));
  for (std::size_t t = 0; t < p.uniforms.size(); ++t)
    p.uniforms[t] = c.k >= 2 ? u[t * static_cast<std::size_t>(c.k) + 1] : 0.0;
  return p;
}

template <class M, class In>
moe_ref::Result reference(const M& mesh, const In& in, const Case& c) {
  return moe_ref::moe_layer(problem(mesh, in, c), reference_options(c));
}

/// The largest |a - b| (infinite when the sizes differ).
inline double max_abs(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return std::numeric_limits<double>::infinity();
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

}  // namespace gshard::test::moe_cases
