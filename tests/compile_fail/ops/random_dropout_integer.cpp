// expect-error: needs_floating_point<gshard::literal<8>{"dropout"}, gshard::literal<6>{"I:x J"}
// Dropout of an integer tensor.
#include <gshard/gshard.hpp>
#include <gshard/ops/random.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<std::int32_t, M, "I:x J">;

auto bad(const X& x) { return gshard::dropout(x, 1, 0.5); }

int main() { return 0; }
