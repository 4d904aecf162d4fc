// expect-error: needs_floating_point<gshard::literal<14>{"random_normal"}, gshard::literal<6>{"I:x J"}
// random_normal of an integer tensor: normal draws are real numbers.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using X = gshard::Sharded<std::int32_t, M, "I:x J">;

X bad(const M& mesh) { return gshard::random_normal<X>(mesh, {4, 4}, 7); }

int main() { return 0; }
