// expect-error: label_not_in_input<gshard::literal<8>{"softmax"}, gshard::literal<2>{"Q"}, gshard::literal<6>{"B S:y"}>
// softmax over a label the input does not have.
#include <gshard/gshard.hpp>
#include <gshard/ops/normalize.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;

auto bad(const X& x) { return gshard::softmax<"Q">(x); }

int main() { return 0; }
