// expect-error: result_has_more_than_8_dimensions<gshard::literal<3>{"XY"}
// Splitting one of 8 dimensions in two would make 9.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "A B C D E F G H">;

auto bad(const X& x) { return gshard::split<"H", "XY">(x, {1, 1}); }

int main() { return 0; }
