// expect-error: implicit_collective<gshard::literal<5>{"relu"}, 0, gshard::literal<7>{"I J +y"}, gshard::literal<4>{"I J"}>
// Strict mode: relu of a partial sum needs an implicit AllReduce first.
#define GSHARD_STRICT
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x", "y">;
using A = gshard::Sharded<float, M, "I K:y">;
using B = gshard::Sharded<float, M, "K:y J">;

auto bad(const A& a, const B& b) { return gshard::relu(gshard::einsum<"IK,KJ->IJ">(a, b)).eval(); }

int main() { return 0; }
