// expect-error: implicit_collective<gshard::literal<5>{"take"}, 0, gshard::literal<6>{"V:x D"}, gshard::literal<4>{"V D"}>
// Strict mode: the indices use V's axis x, so the table must be gathered over V first.
#define GSHARD_STRICT
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Table = gshard::Sharded<float, M, "V:x D">;
using Ids = gshard::Sharded<std::int32_t, M, "B:x S">;

auto bad(const Table& t, const Ids& i) { return gshard::take<"V">(t, i); }

int main() { return 0; }
