// expect-error: top_k_label_not_in_input<gshard::literal<2>{"V"}, gshard::literal<6>{"B S:y"}>
// top_k over a label the input does not have.
#include <gshard/gshard.hpp>
#include <gshard/ops/topk.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;

auto bad(const X& x) { return gshard::top_k<"V", "K">(x, 2).values; }

int main() { return 0; }
