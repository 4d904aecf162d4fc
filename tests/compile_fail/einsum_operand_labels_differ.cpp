// expect-error: operand_labels_differ_from_its_spec<gshard::literal<4>{"GTM"}, gshard::literal<11>{"G:data S M"}>
// The first operand is "G:data S M" but the einsum calls its labels GTM.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;
using W = gshard::Sharded<float, M, "E:expert M H">;

auto bad(const X& x, const W& w) { return gshard::einsum<"GTM,EMH->EGTH">(x, w); }

int main() { return 0; }
