// expect-error: needs_floating_point<gshard::literal<4>{"exp"}>
// exp of an integer tensor: cast to float first.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data">;
using K = gshard::Sharded<std::int32_t, M, "G:data S">;

auto bad(const K& k) { return gshard::exp(k); }

int main() { return 0; }
