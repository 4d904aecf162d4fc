// expect-error: dimension_after_partial_axis<gshard::literal<2>{"S"}
// A dimension comes after a partial '+axis' piece.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G +data S">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
