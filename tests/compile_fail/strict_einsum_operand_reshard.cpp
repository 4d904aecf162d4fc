// expect-error: implicit_collective<gshard::literal<10>{"IK,KJ->IJ"}, 0, gshard::literal<6>{"I K:x"}, gshard::literal<4>{"I K"}>
// Strict mode: the contracting label K is split over x in a, but x already splits J of the
// result, so a would be all-gathered implicitly; strict mode asks for an explicit reshard.
#define GSHARD_STRICT
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x", "y">;
using A = gshard::Sharded<float, M, "I K:x">;
using B = gshard::Sharded<float, M, "K J:x">;

auto bad(const A& a, const B& b) { return gshard::einsum<"IK,KJ->IJ">(a, b); }

int main() { return 0; }
