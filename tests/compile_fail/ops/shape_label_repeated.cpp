// expect-error: label_repeated<gshard::fixed_string<2>{"A"}, gshard::fixed_string<3>{"AA"}
// Splitting into the same label twice.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return gshard::split<"S", "AA">(x, {2, 2}); }

int main() { return 0; }
