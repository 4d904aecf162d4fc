// expect-error: implicit_collective<gshard::literal<10>{"logsumexp"}, 0, gshard::literal<9>{"B S:y +x"}, gshard::literal<6>{"B S:y"}>
// Strict mode: logsumexp of a pending partial sum needs an implicit AllReduce first.
#define GSHARD_STRICT
#include <gshard/gshard.hpp>
#include <gshard/ops/reduce.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y +x">;

auto bad(const X& x) { return gshard::logsumexp<"S">(x); }

int main() { return 0; }
