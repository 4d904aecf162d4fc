#pragma once
// Sums over the blocks of sharded tensors, shared by gradient clipping (clip.hpp) and Adafactor's
// factored moments: which mesh axes split a layout, AllReduce of a few doubles over some axes,
// which copy of a replicated block counts, and local sums of squares and scaling.
#include <Kokkos_Core.hpp>

#include <cstdint>

#include "../comm/collectives.hpp"
#include "../core/layout.hpp"
#include "../kernels/contract.hpp"
#include "../spmd/plan.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/sharded.hpp"

namespace gshard::nn::detail {

using gshard::detail::axes_string;
using gshard::detail::group_size_of;

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
                             axes_string(mask, gshard::detail::axis_name_list<MeshT>()));
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

/// Sum of squares of a local block, accumulated in double. On the host each iteration takes 256
/// elements into 8 partial sums, so the loop vectorises (a single double accumulator chains
/// every add: 4 cycles per element); on devices one element per thread keeps the reads coalesced.
template <class T>
double local_sum_of_squares(const Kokkos::View<T*>& v) {
  constexpr std::int64_t chunk = gshard::detail::host_execution ? 256 : 1;
  const auto n = static_cast<std::int64_t>(v.extent(0));
  double s = 0;
  Kokkos::parallel_reduce(
      "gshard::nn::sum_of_squares", Kokkos::RangePolicy<>(0, (n + chunk - 1) / chunk),
      KOKKOS_LAMBDA(const std::int64_t c, double& acc) {
        const std::int64_t lo = c * chunk, hi = lo + chunk < n ? lo + chunk : n;
        double part[8] = {};
        std::int64_t i = lo;
        for (; i + 8 <= hi; i += 8)
          for (int j = 0; j < 8; ++j) {
            const double x = static_cast<double>(v(i + j));
            part[j] += x * x;
          }
        for (; i < hi; ++i) {
          const double x = static_cast<double>(v(i));
          part[0] += x * x;
        }
        acc += ((part[0] + part[1]) + (part[2] + part[3])) +
               ((part[4] + part[5]) + (part[6] + part[7]));
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

}  // namespace gshard::nn::detail
