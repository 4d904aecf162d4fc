// expect-error: indices_must_be_int32_or_int64<gshard::literal<4>{"B S"}
// The index tensor of take holds floats.
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Table = gshard::Sharded<float, M, "V:x D">;
using Ids = gshard::Sharded<float, M, "B S">;

auto bad(const Table& t, const Ids& i) { return gshard::take<"V">(t, i); }

int main() { return 0; }
