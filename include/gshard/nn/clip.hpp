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

#include "../comm/collectives.hpp"
#include "../core/error.hpp"
#include "../spmd/plan.hpp"
#include "../tensor/sharded.hpp"
#include "diagnostics.hpp"

namespace gshard::nn {

namespace detail {

using gshard::detail::axes_string;
using gshard::detail::group_size_of;

template <class MeshT>
std::vector<std::string> axis_names() {
  return {MeshT::axis_names.begin(), MeshT::axis_names.end()};
}

/// Axes that split some dimension of `l`, size-1 axes included (index checks use
/// nontrivial_split_mask, which leaves those out).
constexpr unsigned split_mask(const Layout& l) {
  unsigned m = 0;
  for (int d = 0; d < l.rank; ++d)
    for (int i = 0; i < l.dims[d].axis_count; ++i) m |= 1u << l.dims[d].axes[i];
  return m;
}

/// Axes that split dimension d of `l`.
constexpr unsigned dim_mask(const Layout& l, int d) {
  unsigned m = 0;
  for (int i = 0; i < l.dims[d].axis_count; ++i) m |= 1u << l.dims[d].axes[i];
  return m;
}

/// In-place sum of n doubles over the mesh axes in `mask`; nothing when they multiply to 1.
template <class MeshT>
void sum_over_axes(const MeshT& mesh, unsigned mask, double* data, std::int64_t n) {
  if (group_size_of(mask, mesh.sizes()) == 1) return;
  gshard::detail::all_reduce(data, n, ReduceOp::sum, mesh.group(mask),
                             axes_string(mask, axis_names<MeshT>()));
}

/// True on the one copy of each block that counts: coordinate 0 on every axis the layout does
/// not split.
template <class MeshT>
bool counts_once(const Layout& l, const MeshT& mesh) {
  const unsigned split = split_mask(l);
  for (int a = 0; a < MeshT::axis_count; ++a)
    if (!(split & (1u << a)) && mesh.coordinate(a) != 0) return false;
  return true;
}

/// Sum of squares of a local block, accumulated in double.
template <class T>
double local_sum_of_squares(const Kokkos::View<T*>& v) {
  double s = 0;
  Kokkos::parallel_reduce(
      "gshard::nn::sum_of_squares",
      Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(v.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i, double& acc) {
        const double x = static_cast<double>(v(i));
        acc += x * x;
      },
      s);
  return s;
}

template <class T>
void scale_in_place(const Kokkos::View<T*>& v, double factor) {
  const T f = static_cast<T>(factor);
  Kokkos::parallel_for(
      "gshard::nn::scale", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(v.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) { v(i) *= f; });
}

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
    const void* mesh_state = &first.mesh().state();
    std::size_t index = 0;
    auto check_mesh = [&](const auto& g) {
      if (static_cast<const void*>(&g.mesh().state()) != mesh_state)
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
