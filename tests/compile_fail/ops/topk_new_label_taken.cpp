// expect-error: new_label_already_in_input<gshard::literal<2>{"B"}, gshard::literal<6>{"B S:y"}>
// top_k's new label must not be another label of the input.
#include <gshard/gshard.hpp>
#include <gshard/ops/topk.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;

auto bad(const X& x) { return gshard::top_k<"S", "B">(x, 2).values; }

int main() { return 0; }
