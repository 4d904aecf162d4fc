// expect-error: view_element_type_differs<float, double>
// A View of float adopted as a tensor of double: gshard converts nothing behind the caller.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using Grid = gshard::Sharded<double, M, "I:x J">;

Grid bad(const M& mesh, const Kokkos::View<float**>& v) {
  return gshard::adopt<Grid>(mesh, {4, 4}, v);
}

int main() { return 0; }
