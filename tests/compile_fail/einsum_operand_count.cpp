// expect-error: wrong_operand_count<gshard::literal<8>{"GSM->GS"}>
// A unary spec given two operands.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;
using W = gshard::Sharded<float, M, "E:expert M H">;

auto bad(const X& x, const W& w) { return gshard::einsum<"GSM->GS">(x, w); }

int main() { return 0; }
