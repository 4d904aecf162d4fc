// expect-error: indexed_label_not_in_table<gshard::literal<2>{"Q"}
// take<"Q"> on a table without a label Q.
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Table = gshard::Sharded<float, M, "V:x D">;
using Ids = gshard::Sharded<std::int32_t, M, "B S">;

auto bad(const Table& t, const Ids& i) { return gshard::take<"Q">(t, i); }

int main() { return 0; }
