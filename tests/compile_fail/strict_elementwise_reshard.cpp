// expect-error: implicit_collective<gshard::literal<4>{"add"}, 1, gshard::literal<6>{"I J:x"}, gshard::literal<6>{"I:x J"}>
// Strict mode: b splits J over x while the sum takes a's split of I over x: b would be
// resharded implicitly.
#define GSHARD_STRICT
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using A = gshard::Sharded<float, M, "I:x J">;
using B = gshard::Sharded<float, M, "I J:x">;

auto bad(const A& a, const B& b) { return (a + b).eval(); }

int main() { return 0; }
