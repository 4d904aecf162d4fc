// expect-error: needs_floating_point<gshard::literal<5>{"norm"}, gshard::literal<6>{"B S:y"}>
// The L2 norm of integers.
#include <gshard/gshard.hpp>
#include <gshard/ops/reduce.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<std::int32_t, M, "B S:y">;

auto bad(const X& x) { return gshard::norm<"S">(x); }

int main() { return 0; }
