#pragma once
// Global-norm gradient clipping over sharded tensors.
//
//   global_norm(std::tie(g1, g2, ...))              sqrt of the sum of squares of every element
//   clip_by_global_norm(std::tie(g1, ...), max)     the norm before clipping; when it exceeds
//                                                   max, every tensor is scaled by max / norm
//
// Each global element counts once: a rank adds its block only when it sits at coordinate 0 of
// every mesh axis that replicates the tensor (the other copies hold the same values), and padding
// is zero. One AllReduce of one double over the whole mesh covers all tensors together.
#include <Kokkos_Core.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <source_location>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "../tensor/sharded.hpp"
#include "diagnostics.hpp"
#include "mesh_sums.hpp"

namespace gshard::nn {

namespace detail {

template <class G>
void check_clip_operand() {
  using gshard::detail::shown;
  if constexpr (!ShardedTensor<G>) {
    static_assert(sizeof(nn_error::needs_sharded_tensor<shown<fixed_string("global_norm")>, G>) ==
                  0);
  } else if constexpr (!std::is_floating_point_v<typename G::value_type>) {
    static_assert(
        sizeof(
            nn_error::needs_floating_point<shown<fixed_string("global_norm")>, shown<G::spec>>) ==
        0);
  } else if constexpr (G::layout.partial_count != 0) {
    static_assert(
        sizeof(nn_error::holds_partial_sums<shown<fixed_string("global_norm")>, shown<G::spec>>) ==
        0);
  }
}

template <class... G>
double global_norm_impl(const char* op, const std::tuple<G&...>& grads) {
  (check_clip_operand<std::remove_cv_t<G>>(), ...);
  if constexpr (sizeof...(G) == 0) {
    return 0.0;
  } else {
    const auto& first = std::get<0>(grads);
    using MeshT = typename std::remove_cvref_t<decltype(first)>::mesh_type;
    const void* first_mesh = &gshard::detail::mesh_state(first.mesh());
    std::size_t index = 0;
    auto check_mesh = [&](const auto& g) {
      if (static_cast<const void*>(&gshard::detail::mesh_state(g.mesh())) != first_mesh)
        throw Error(op, "tensor " + std::to_string(index) + " (" + g.describe() +
                            ") lives on another mesh than tensor 0; all must share one mesh");
      ++index;
    };
    std::apply([&](const auto&... g) { (check_mesh(g), ...); }, grads);
    double sum = 0;
    std::apply(
        [&](const auto&... g) {
          ((sum += counts_once(std::remove_cvref_t<decltype(g)>::layout, first.mesh())
                       ? local_sum_of_squares(g.local_view())
                       : 0.0),
           ...);
        },
        grads);
    const unsigned all = (1u << MeshT::axis_count) - 1u;
    sum_over_axes(first.mesh(), all, &sum, 1);
    return std::sqrt(sum);
  }
}

}  // namespace detail

/// The L2 norm over every element of every tensor (each global element once). Collective over
/// the tensors' mesh: one AllReduce of one double.
template <class... G>
double global_norm(std::tuple<G&...> grads) {
  return detail::global_norm_impl("global_norm", grads);
}

/// Scales the tensors in place by max_norm / norm when their global norm exceeds max_norm;
/// returns the norm before clipping. Collective: one AllReduce of one double.
template <class... G>
double clip_by_global_norm(std::tuple<G&...> grads, double max_norm,
                           std::source_location where = std::source_location::current()) {
  const gshard::detail::UserSite site(where, "clip_by_global_norm");
  if (!(max_norm > 0))
    throw Error("clip_by_global_norm",
                "max_norm is " + std::to_string(max_norm) + "; it must be positive");
  const double norm = detail::global_norm_impl("clip_by_global_norm", grads);
  if (norm > max_norm) {
    const double factor = max_norm / norm;
    std::apply(
        [&](auto&... g) {
          ((detail::scale_in_place(g.local_view(), factor),
            gshard::detail::mark_updated(g, "clip_by_global_norm")),
           ...);
        },
        grads);
  }
  return norm;
}

}  // namespace gshard::nn
