// expect-error: parameter_must_be_a_float_or_double_tensor<gshard::literal<6>{"track"}, gshard::Sharded<int
// Tracking an integer tensor as a parameter: gradients exist for float and double only.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using I = gshard::Sharded<int, M, "I:x">;
using W = gshard::Sharded<float, M, "I:x">;

void bad(W& w, I& ids) { gshard::track(std::tie(w, ids)); }

int main() { return 0; }
