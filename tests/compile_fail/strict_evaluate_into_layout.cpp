// expect-error: evaluation_into_layout_communicates<gshard::literal<6>{"I:x J"}, gshard::literal<6>{"I J:x"}>
// Strict mode: evaluating an expression into a declared layout that needs a collective must be
// written gshard::reshard<Cols>(a * 2.0f).
#define GSHARD_STRICT
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using Rows = gshard::Sharded<float, M, "I:x J">;
using Cols = gshard::Sharded<float, M, "I J:x">;

Cols bad(const Rows& a) {
  Cols c = a * 2.0f;
  return c;
}

int main() { return 0; }
