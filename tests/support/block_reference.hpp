#pragma once
// The tests' own shard geometry, written independently of the library's (tensor/geometry.hpp),
// so property tests compare the library against a second implementation.
#include <algorithm>
#include <cstdint>
#include <vector>

namespace gshard::test {

/// Mesh axis sizes and this rank's coordinates (row-major, last axis fastest).
struct Grid {
  std::vector<int> sizes;
  std::vector<int> coords;
};

inline Grid grid_of(const std::vector<int>& sizes, int rank) {
  Grid g{sizes, std::vector<int>(sizes.size())};
  for (std::size_t i = sizes.size(); i-- > 0;) {
    g.coords[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return g;
}

struct Block1 {
  std::int64_t offset, valid, chunk;
};

/// Dimension of size n split over `axes` (major first): block index row-major over the axes,
/// chunk c = ceil(n/k), block [i*c, min(n, (i+1)*c)).
inline Block1 block1(std::int64_t n, const int* axes, int count, const Grid& grid) {
  std::int64_t k = 1;
  std::int64_t index = 0;
  for (int i = 0; i < count; ++i) {
    const auto a = static_cast<std::size_t>(axes[i]);
    k *= grid.sizes[a];
    index = index * grid.sizes[a] + grid.coords[a];
  }
  const std::int64_t c = (n + k - 1) / k;
  const std::int64_t offset = index * c;
  return {offset, std::max<std::int64_t>(0, std::min(n, offset + c) - offset), c};
}

/// The project's mesh matrix for a rank count: every two-axis shape, and 2x2x2 at 8 ranks.
inline std::vector<std::vector<int>> listed_mesh_shapes(int n) {
  std::vector<std::vector<int>> out;
  for (int a = 1; a <= n; ++a)
    if (n % a == 0) out.push_back({a, n / a});
  if (n == 8) out.push_back({2, 2, 2});
  return out;
}

}  // namespace gshard::test
