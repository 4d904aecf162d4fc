// expect-error: needs_floating_point<gshard::literal<12>{"log_softmax"}, gshard::literal<6>{"B S:y"}>
// log_softmax of integers.
#include <gshard/gshard.hpp>
#include <gshard/ops/normalize.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<std::int64_t, M, "B S:y">;

auto bad(const X& x) { return gshard::log_softmax<"S">(x); }

int main() { return 0; }
