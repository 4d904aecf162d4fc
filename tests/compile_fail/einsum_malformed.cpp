// expect-error: malformed_einsum<gshard::literal<13>{"GSM;EMH-EGSH"}
// An einsum without "->".
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;
using W = gshard::Sharded<float, M, "E:expert M H">;

auto bad(const X& x, const W& w) { return gshard::einsum<"GSM;EMH-EGSH">(x, w); }

int main() { return 0; }
