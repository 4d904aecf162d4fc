// expect-error: one_hot_needs_integer_indices<gshard::literal<2>{"E"}, gshard::literal<6>{"B S:y"}>
// one_hot takes integer indices.
#include <gshard/gshard.hpp>
#include <gshard/ops/topk.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;

auto bad(const X& x) { return gshard::one_hot<"E">(x, 4); }

int main() { return 0; }
