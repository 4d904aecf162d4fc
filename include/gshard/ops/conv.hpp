#pragma once
// Windowed ops: conv1d/conv2d (cross-correlation, as PyTorch's conv) and max/avg pooling, whose
// spatial labels may be split over mesh axes. Each rank first fetches the input rows its output
// windows need from the ranks along that label's axes (a halo exchange by send_recv, several
// hops when the halo is wider than a shard), one spatial label after another (so corners arrive
// in two steps), then runs one local Kokkos kernel over its output block.
//
// The parts: ops/conv/rules.hpp (specs, options, the partition rule, compile-time checks),
// spmd/halo.hpp (the halo exchange and its adjoint), ops/conv/forward.hpp (the forward passes on
// run-time layouts), ops/conv/cotangents.hpp (the backward passes); the typed API is here.
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>

#include "../expr/node.hpp"
#include "../tensor/sharded.hpp"
#include "conv/cotangents.hpp"
#include "conv/forward.hpp"
#include "conv/rules.hpp"

namespace gshard {

namespace detail {

template <fixed_string Name, fixed_string Spec, int Count, class X, class W>
auto conv_typed(const X& x, const W& w, const ConvOptions& opt) {
  if constexpr (!conv_spec_ok<Spec, false>()) {
    return 0;
  } else if constexpr (!conv_count_ok<Spec, Count>() || !conv_operands_ok<Spec, X, W>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename X::value_type, typename W::value_type> &&
                      std::is_same_v<typename X::mesh_type, typename W::mesh_type>,
                  "gshard::conv: input and weights must have the same element type and Mesh type");
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    constexpr ConvSpec s = parse_conv(Spec.view()).spec;
    constexpr ConvLayouts L = infer_conv(s, X::layout, W::layout);
    // The weights' reshard (whole kernel labels, finished partial sums) is a collective.
    static_assert(strict_check<MeshT, Name, 0, X::layout, L.input>() &&
                  strict_check<MeshT, Name, 1, W::layout, L.weights>());
    const std::string op = std::string(Name.view()) + " \"" + std::string(Spec.view()) + "\"";
    const RuntimeTensor<T> xr = materialise_as(x, L.input, op);
    const RuntimeTensor<T> wr = materialise_as(w, L.weights, op);
    using R = Sharded<T, MeshT, spec_of<MeshT, L.output>()>;
    if constexpr (differentiable_v<T>) {
      const bool need_x = xr.grad != nullptr, need_w = wr.grad != nullptr;
      if (recording() && (need_x || need_w)) {
        ConvSaved<T> sv;
        RuntimeTensor<T> r = conv_runtime<T>(op, s, opt, detail::mesh_state(x.mesh()),
                                             axis_name_list<MeshT>(), xr, wr, &sv);
        // Keep only what the wanted cotangents read: the weights for dx, the widened input
        // for dw.
        if (!need_x) sv.w = {};
        if (!need_w) sv.halo.data = {};
        record(x.mesh(), r, op, std::source_location{}, {xr.grad, wr.grad},
               [cs = s, sv, need_x, need_w, m = x.mesh()](const RuntimeTensor<T>& g) {
                 Cotangents c(2);
                 if (need_x)
                   c[0] = AnyTensor(conv_input_cotangent<T>(cs, sv, g, detail::mesh_state(m),
                                                            axis_name_list<MeshT>()));
                 if (need_w)
                   c[1] = AnyTensor(conv_weight_cotangent<T>(cs, sv, g, detail::mesh_state(m)));
                 return c;
               });
        return sharded_from<R>(x.mesh(), r);
      }
    }
    const RuntimeTensor<T> r =
        conv_runtime<T>(op, s, opt, detail::mesh_state(x.mesh()), axis_name_list<MeshT>(), xr, wr);
    return R(x.mesh(), r.shape, r.data);
  }
}

template <fixed_string Name, fixed_string Spec, PoolKind Kind, class X>
auto pool_typed(const X& x, const PoolOptions& opt) {
  if constexpr (!conv_spec_ok<Spec, true>()) {
    return 0;
  } else if constexpr (!pool_labels_in_input<Spec, X>(
                           std::make_integer_sequence<
                               int, parse_pool(Spec.view()).spec.spatial_count>{})) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    static_assert(std::is_floating_point_v<T>, "gshard::max_pool/avg_pool need float or double");
    constexpr Layout L = infer_pool(X::layout, Kind == PoolKind::max);
    // Max pooling finishes a pending partial sum (the implicit collective of strict mode).
    static_assert(strict_check<MeshT, Name, 0, X::layout, L>());
    const std::string op = std::string(Name.view()) + " \"" + std::string(Spec.view()) + "\"";
    const RuntimeTensor<T> xr = materialise_as(x, L, op);
    constexpr ConvSpec spec = parse_pool(Spec.view()).spec;
    using R = Sharded<T, MeshT, spec_of<MeshT, L>()>;
    if (xr.grad && recording()) {
      ConvSaved<T> sv;
      RuntimeTensor<T> r = pool_runtime<T>(op, Kind, spec, opt, detail::mesh_state(x.mesh()),
                                           axis_name_list<MeshT>(), xr, &sv);
      if (Kind == PoolKind::avg) sv.halo.data = {};  // the average's cotangent needs no values
      record(x.mesh(), r, op, std::source_location{}, {xr.grad},
             [cs = spec, sv, m = x.mesh()](const RuntimeTensor<T>& g) {
               return Cotangents{AnyTensor(pool_input_cotangent<T>(
                   Kind, cs, sv, g, detail::mesh_state(m), axis_name_list<MeshT>()))};
             });
      return sharded_from<R>(x.mesh(), r);
    }
    const RuntimeTensor<T> r = pool_runtime<T>(op, Kind, spec, opt, detail::mesh_state(x.mesh()),
                                               axis_name_list<MeshT>(), xr);
    return R(x.mesh(), r.shape, r.data);
  }
}

}  // namespace detail

/// conv<"H:K W:L C->O">(x, w, options): cross-correlation of input x (labels include H, W, C)
/// with weights w (labels exactly O, C, K, L, any order), as PyTorch's conv with bias=False:
/// out[.., O, .., h, w] = sum_{C,K,L} x[.., C, .., h*s + k*d - pad, w*s + l*d - pad] w[O, C, k, l].
/// The result has x's labels in x's order with C replaced by O. Eager; collective.
template <fixed_string Spec, Expression X, Expression W>
auto conv(const X& x, const W& w, const ConvOptions& options = {},
          std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "conv");
  return detail::conv_typed<"conv", Spec, 0>(x, w, options);
}
/// conv with exactly one spatial label: conv1d<"L:K C->O">.
template <fixed_string Spec, Expression X, Expression W>
auto conv1d(const X& x, const W& w, const ConvOptions& options = {},
            std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "conv1d");
  return detail::conv_typed<"conv1d", Spec, 1>(x, w, options);
}
/// conv with exactly two spatial labels: conv2d<"H:K W:L C->O">.
template <fixed_string Spec, Expression X, Expression W>
auto conv2d(const X& x, const W& w, const ConvOptions& options = {},
            std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "conv2d");
  return detail::conv_typed<"conv2d", Spec, 2>(x, w, options);
}

/// max_pool<"HW">(x, {.window = {2, 2}}): the maximum over each window (no padding; stride
/// defaults to the window). A pending partial sum of x is finished first. Eager; collective.
template <fixed_string Spec, Expression X>
auto max_pool(const X& x, const PoolOptions& options,
              std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "max_pool");
  return detail::pool_typed<"max_pool", Spec, detail::PoolKind::max>(x, options);
}
/// avg_pool<"HW">(x, {.window = {2, 2}}): the mean over each window; linear, so pending partial
/// sums of x stay pending in the result.
template <fixed_string Spec, Expression X>
auto avg_pool(const X& x, const PoolOptions& options,
              std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "avg_pool");
  return detail::pool_typed<"avg_pool", Spec, detail::PoolKind::avg>(x, options);
}

}  // namespace gshard
