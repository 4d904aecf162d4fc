#pragma once
// Reductions over one or more labels: sum<"SM">(x), mean, max, min, argmax, argmin (int64: the
// global index), logsumexp, norm (L2). The result keeps the input's other labels with their
// splits. sum and mean are linear: over a split label they leave a pending partial sum (no
// communication, like einsum rule 3) and keep the input's pending sums. The others finish at
// once: a pending input is finished first, then a local reduction over the valid elements
// (padding acts as the identity) and AllReduce(s) over the reduced labels' axes.
//
// The parts: ops/reduce/rules.hpp (diagnostics, kinds, result layouts), ops/reduce/local.hpp
// (the local kernel), ops/reduce/runtime.hpp (the sharded engine and its gradient).
#include <source_location>

#include "../expr/node.hpp"
#include "reduce/local.hpp"
#include "reduce/rules.hpp"
#include "reduce/runtime.hpp"

namespace gshard {
namespace detail {

template <Reduction K, fixed_string Op, fixed_string Labels, class E>
constexpr bool reduce_ok() {
  constexpr ReduceLabelCheck c = check_reduce_labels(Labels.view(), E::layout);
  if constexpr (c.error == 3) {
    return sizeof(reduce_error::no_labels_to_reduce<detail::shown<Op>, detail::shown<E::spec>>) ==
           0;
  } else if constexpr (c.error == 1) {
    constexpr auto label = make_fixed<1>(Labels.view().substr(c.at, 1));
    return sizeof(reduce_error::label_not_in_input<detail::shown<Op>, detail::shown<label>,
                                                   detail::shown<E::spec>>) == 0;
  } else if constexpr (c.error == 2) {
    constexpr auto label = make_fixed<1>(Labels.view().substr(c.at, 1));
    return sizeof(reduce_error::label_repeated<detail::shown<Op>, detail::shown<label>,
                                               detail::shown<Labels>>) == 0;
  } else if constexpr ((K == Reduction::mean || K == Reduction::logsumexp ||
                        K == Reduction::norm) &&
                       !std::is_floating_point_v<typename E::value_type>) {
    return sizeof(reduce_error::needs_floating_point<detail::shown<Op>, detail::shown<E::spec>>) ==
           0;
  } else {
    return true;
  }
}

/// The typed reduction: the result type from reduce_layout at compile time; a non-linear one
/// finishes the input's pending sums first (an implicit collective: strict mode refuses it).
template <Reduction K, fixed_string Op, fixed_string Labels, class E>
auto reduce_typed(const E& x) {
  if constexpr (!reduce_ok<K, Op, Labels, E>()) {
    return 0;
  } else {
    using T = typename E::value_type;
    using MeshT = typename E::mesh_type;
    constexpr bool linear = reduction_is_linear(K);
    constexpr Layout in = E::layout;
    constexpr Layout out = reduce_layout(in, Labels.view(), linear);
    constexpr bool arg = K == Reduction::argmax || K == Reduction::argmin;
    using V = std::conditional_t<arg, std::int64_t, T>;
    using R = Sharded<V, MeshT, spec_of<MeshT, out>()>;
    if constexpr (!linear) static_assert(strict_check<MeshT, Op, 0, in, finished_layout(in)>());
    const RuntimeTensor<T> v =
        linear ? materialise(x) : materialise_as(x, finished_layout(in), std::string(Op.view()));
    Reduced<T> r = reduce_runtime<T>(K, Labels.view(), detail::mesh_state(x.mesh()),
                                     axis_name_list<MeshT>(), v);
    if constexpr (arg) {
      return R(x.mesh(), r.index.shape, r.index.data);
    } else {
      if constexpr (differentiable_v<T>) {
        if (v.grad && recording()) {
          double count = 1;
          for (char c : Labels.view())
            count *= static_cast<double>(v.shape[static_cast<std::size_t>(v.layout.find(c))]);
          // A sum or mean needs only the input's layout and shape, not its values.
          const bool values = K != Reduction::sum && K != Reduction::mean;
          const RuntimeTensor<T> xs(v.layout, v.shape, values ? v.data : Kokkos::View<T*>{},
                                    v.partial_op);
          const RuntimeTensor<T> res(r.value.layout, r.value.shape,
                                     values ? r.value.data : Kokkos::View<T*>{});
          record(x.mesh(), r.value, std::string(Op.view()) + "<" + std::string(Labels.view()) + ">",
                 std::source_location{}, {v.grad},
                 [xs, res, count, m = x.mesh()](const RuntimeTensor<T>& g) {
                   return Cotangents{AnyTensor(reduce_cotangent<T>(
                       K, count, xs, res, g, detail::mesh_state(m), axis_name_list<MeshT>()))};
                 });
        }
      }
      return sharded_from<R>(x.mesh(), r.value);
    }
  }
}

}  // namespace detail

/// Sum over the labels: partial over their axes (no communication); pending sums stay pending.
template <fixed_string Labels, Expression E>
auto sum(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "sum");
  return detail::reduce_typed<detail::Reduction::sum, "sum", Labels>(x);
}
/// Mean over the labels (the sum divided by their global sizes): partial like sum.
template <fixed_string Labels, Expression E>
auto mean(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "mean");
  return detail::reduce_typed<detail::Reduction::mean, "mean", Labels>(x);
}
/// Maximum over the labels; over a split label one AllReduce (max) of the result's block.
template <fixed_string Labels, Expression E>
auto max(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "max");
  return detail::reduce_typed<detail::Reduction::max, "max", Labels>(x);
}
/// Minimum over the labels; over a split label one AllReduce (min).
template <fixed_string Labels, Expression E>
auto min(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "min");
  return detail::reduce_typed<detail::Reduction::min, "min", Labels>(x);
}
/// The global index (int64) of the maximum: row-major over the labels in the order written;
/// the smallest on ties. Over a split label: AllReduce max of values, AllReduce min of indices.
template <fixed_string Labels, Expression E>
auto argmax(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "argmax");
  return detail::reduce_typed<detail::Reduction::argmax, "argmax", Labels>(x);
}
/// As argmax, for the minimum.
template <fixed_string Labels, Expression E>
auto argmin(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "argmin");
  return detail::reduce_typed<detail::Reduction::argmin, "argmin", Labels>(x);
}
/// log(sum(exp(x))), stable: AllReduce max, then AllReduce sum of exp(x - max).
template <fixed_string Labels, Expression E>
auto logsumexp(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "logsumexp");
  return detail::reduce_typed<detail::Reduction::logsumexp, "logsumexp", Labels>(x);
}
/// The L2 norm: AllReduce sum of squares, then sqrt.
template <fixed_string Labels, Expression E>
auto norm(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "norm");
  return detail::reduce_typed<detail::Reduction::norm, "norm", Labels>(x);
}

}  // namespace gshard
