// expect-error: give_exactly_one_label<gshard::literal<11>{"layer_norm"}, gshard::literal<3>{"BS"}>
// layer_norm over two labels at once.
#include <gshard/gshard.hpp>
#include <gshard/ops/normalize.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;

auto bad(const X& x) { return gshard::layer_norm<"BS">(x); }

int main() { return 0; }
