// expect-error: seed_must_be_an_integer<double>
// The pre-issue-20 argument order dropout(x, rate, seed): the rate lands where the seed goes.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "I:x J">;

auto bad(const X& x) { return gshard::dropout(x, 0.1, 42); }

int main() { return 0; }
