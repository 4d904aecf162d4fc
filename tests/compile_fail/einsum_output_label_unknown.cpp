// expect-error: output_label_in_no_operand<gshard::literal<2>{"Q"}
// An output label that no operand has.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;
using W = gshard::Sharded<float, M, "E:expert M H">;

auto bad(const X& x, const W& w) { return gshard::einsum<"GSM,EMH->EGQH">(x, w); }

int main() { return 0; }
