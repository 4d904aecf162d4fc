// expect-error: gain_or_bias_labels_differ_from_the_label<gshard::literal<9>{"rms_norm"}, gshard::literal<2>{"S"}, gshard::literal<4>{"B S"}>
// A gain with more labels than the normalized one (broadcasting a gain over other labels is not a
// normalization parameter).
#include <gshard/gshard.hpp>
#include <gshard/ops/normalize.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;
using G = gshard::Sharded<float, M, "B S">;

auto bad(const X& x, const G& g) { return gshard::rms_norm<"S">(x, g); }

int main() { return 0; }
