// expect-error: view_rank_differs_from_spec<3, 2>
// A rank-3 View adopted as a tensor with two labels.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using Grid = gshard::Sharded<double, M, "I:x J">;

Grid bad(const M& mesh, const Kokkos::View<double***>& v) {
  return gshard::adopt<Grid>(mesh, {4, 4}, v);
}

int main() { return 0; }
