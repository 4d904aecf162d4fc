#pragma once
// Shard geometry: which block of the global tensor a rank holds under a layout.
//
// A dimension of global size N split over axes with k shards in all (the product of their
// sizes) is cut into k blocks of ceil(N/k); block i covers [i*c, min(N, (i+1)*c)). Every rank
// stores the full padded block c, so local shapes are the same on every rank; the padding at
// the end of the last blocks (all of a block past N) holds zeros and never reaches a result.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../core/layout.hpp"
#include "../mesh/mesh.hpp"

namespace gshard {

using Shape = std::vector<std::int64_t>;
using Coords = std::array<int, max_axes>;

namespace detail {

inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return b == 0 ? 0 : (a + b - 1) / b;
}

/// Shards of dimension d: the product of its axes' sizes.
inline int shard_count(const DimLayout& dim, const std::array<int, max_axes>& sizes) {
  int k = 1;
  for (int i = 0; i < dim.axis_count; ++i) k *= sizes[static_cast<std::size_t>(dim.axes[i])];
  return k;
}

/// The block index of dimension d at mesh coordinates c (row-major over its axes, major first).
inline int shard_index(const DimLayout& dim, const std::array<int, max_axes>& sizes,
                       const Coords& c) {
  int index = 0;
  for (int i = 0; i < dim.axis_count; ++i) {
    const auto axis = static_cast<std::size_t>(dim.axes[i]);
    index = index * sizes[axis] + c[axis];
  }
  return index;
}

/// One dimension's block at some coordinates: [offset, offset + valid), stored padded to chunk.
struct Block {
  std::int64_t offset = 0;
  std::int64_t valid = 0;
  std::int64_t chunk = 0;
};

inline Block block_of(const DimLayout& dim, std::int64_t global,
                      const std::array<int, max_axes>& sizes, const Coords& c) {
  const int k = shard_count(dim, sizes);
  const std::int64_t chunk = ceil_div(global, k);
  const std::int64_t offset = chunk * shard_index(dim, sizes, c);
  return {offset, std::clamp<std::int64_t>(global - offset, 0, chunk), chunk};
}

/// The padded local extent of each dimension (same on every rank).
inline Shape local_extents(const Layout& layout, const Shape& global,
                           const std::array<int, max_axes>& sizes) {
  Shape out(static_cast<std::size_t>(layout.rank));
  for (int d = 0; d < layout.rank; ++d)
    out[static_cast<std::size_t>(d)] =
        ceil_div(global[static_cast<std::size_t>(d)], shard_count(layout.dims[d], sizes));
  return out;
}

/// Whether the rank at `coords` holds the copy of its block that writes it to a file: coordinate 0
/// on every mesh axis that does not split the layout (the other copies are the same values).
inline bool writes_block(const Layout& layout, const Coords& coords, int axis_count) {
  for (int a = 0; a < axis_count; ++a)
    if (layout.dim_on_axis(a) < 0 && coords[static_cast<std::size_t>(a)] != 0) return false;
  return true;
}

inline std::int64_t product(const Shape& s) {
  std::int64_t p = 1;
  for (auto v : s) p *= v;
  return p;
}

/// "G:data S M +expert" written back with the mesh's axis names (core/layout.hpp).
template <std::size_t N>
std::string layout_string(const Layout& layout, const std::array<std::string_view, N>& axes) {
  return format_layout(layout, axes);
}

inline std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s.append(i ? ", " : "").append(std::to_string(shape[i]));
  return s + "]";
}

}  // namespace detail
}  // namespace gshard
