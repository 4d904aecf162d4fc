// expect-error: implicit_collective<gshard::literal<11>{"layer_norm"}, 1, gshard::literal<4>{"S:x"}, gshard::literal<4>{"S:y"}>
// Strict mode: a gain split over another axis than the input's label needs a reshard.
#define GSHARD_STRICT
#include <gshard/gshard.hpp>
#include <gshard/ops/normalize.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;
using G = gshard::Sharded<float, M, "S:x">;

auto bad(const X& x, const G& g) { return gshard::layer_norm<"S">(x, g); }

int main() { return 0; }
