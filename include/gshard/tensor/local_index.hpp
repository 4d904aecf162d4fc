#pragma once
// A rank's block as index arithmetic that kernels can carry by value.
#include <Kokkos_Core.hpp>
#include <cstdint>

#include "geometry.hpp"

namespace gshard::detail {

/// Local padded extents, global offsets, valid extents and global row-major strides.
struct BlockIndex {
  int rank = 0;
  std::int64_t extent[max_dims]{};
  std::int64_t offset[max_dims]{};
  std::int64_t valid[max_dims]{};
  std::int64_t global_stride[max_dims]{};
  bool holds_values = true;  // false on ranks with a nonzero coordinate on a partial axis

  /// Global linear index of local element `i`, or -1 for padding (or a zero partial copy).
  KOKKOS_INLINE_FUNCTION std::int64_t global_of(std::int64_t i) const {
    if (!holds_values) return -1;
    std::int64_t g = 0;
    for (int d = rank - 1; d >= 0; --d) {
      const std::int64_t local = i % extent[d];
      i /= extent[d];
      if (local >= valid[d]) return -1;
      g += (offset[d] + local) * global_stride[d];
    }
    return g;
  }
};

/// The block of the rank at coordinates `c` under `layout`.
inline BlockIndex block_index(const Layout& layout, const Shape& global,
                              const std::array<int, max_axes>& sizes, const Coords& c) {
  BlockIndex b;
  b.rank = layout.rank;
  std::int64_t stride = 1;
  for (int d = layout.rank - 1; d >= 0; --d) {
    const auto du = static_cast<std::size_t>(d);
    const Block blk = block_of(layout.dims[d], global[du], sizes, c);
    b.extent[d] = blk.chunk;
    b.offset[d] = blk.offset;
    b.valid[d] = blk.valid;
    b.global_stride[d] = stride;
    stride *= global[du];
  }
  for (int i = 0; i < layout.partial_count; ++i)
    if (c[static_cast<std::size_t>(layout.partial[i])] != 0) b.holds_values = false;
  return b;
}

}  // namespace gshard::detail
