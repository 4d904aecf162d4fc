// expect-error: label_not_in_input<gshard::literal<4>{"max"}, gshard::literal<2>{"Q"}, gshard::literal<10>{"B:x S:y M"}>
// A reduced label that the input does not have.
#include <gshard/gshard.hpp>
#include <gshard/ops/reduce.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B:x S:y M">;

auto bad(const X& x) { return gshard::max<"SQ">(x); }

int main() { return 0; }
