#pragma once
// The one data-movement kernel of resharding: copy a box between two row-major arrays whose
// dimensions may come in different orders. Packing, unpacking, slicing and transposing are all
// this kernel with other arguments.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "../core/layout.hpp"

namespace gshard::detail {

struct BoxCopy {
  int rank = 0;                         // dimensions, in destination order
  std::int64_t box[max_dims]{};         // box extent per destination dim
  std::int64_t dst_start[max_dims]{};   // box origin in the destination, per destination dim
  std::int64_t dst_stride[max_dims]{};  // destination strides, per destination dim
  std::int64_t src_start[max_dims]{};   // box origin in the source, per destination dim
  std::int64_t src_stride[max_dims]{};  // source strides of the matching source dim

  [[nodiscard]] std::int64_t volume() const {
    std::int64_t v = 1;
    for (int d = 0; d < rank; ++d) v *= box[d];
    return v;
  }
};

/// dst[box] = src[box], where `dst` and `src` are flat views (or pointers) into row-major data.
template <class T>
void copy_box(const T* src, T* dst, const BoxCopy& c) {
  const std::int64_t n = c.volume();
  if (n == 0) return;
  Kokkos::parallel_for(
      "gshard::copy_box", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        std::int64_t s = 0;
        std::int64_t t = 0;
        for (int d = c.rank - 1; d >= 0; --d) {
          const std::int64_t k = i % c.box[d];
          i /= c.box[d];
          s += (c.src_start[d] + k) * c.src_stride[d];
          t += (c.dst_start[d] + k) * c.dst_stride[d];
        }
        dst[t] = src[s];
      });
}

/// Row-major strides of extents `e`.
inline void row_major_strides(int rank, const std::int64_t* e, std::int64_t* stride) {
  std::int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    stride[d] = s;
    s *= e[d];
  }
}

}  // namespace gshard::detail
