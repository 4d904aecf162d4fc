// expect-error: loss_must_be_floating_point<gshard::literal<1>{""}, int>
// grad of an integer "loss" (a count): there is no gradient to take.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using W = gshard::Sharded<float, M, "I:x">;
using Count = gshard::Sharded<int, M, "">;

auto bad(const Count& c, const W& w) { return gshard::grad(c, w); }

int main() { return 0; }
