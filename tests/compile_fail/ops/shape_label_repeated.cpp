// expect-error: label_repeated<gshard::literal<2>{"A"}, gshard::literal<3>{"AA"}
// Splitting into the same label twice.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return gshard::split<"S", "AA">(x, {2, 2}); }

int main() { return 0; }
