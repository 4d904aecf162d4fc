// expect-error: label_repeated_in_einsum_term<gshard::literal<2>{"S"}
// A label twice in one operand (no diagonals).
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;
using W = gshard::Sharded<float, M, "E:expert M H">;

auto bad(const X& x, const W& w) { return gshard::einsum<"GSMS,EMH->EGH">(x, w); }

int main() { return 0; }
