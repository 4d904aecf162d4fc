// expect-error: index_label_also_in_table<gshard::literal<2>{"D"}
// An index label that is also a table label: the result would have D twice.
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Table = gshard::Sharded<float, M, "V:x D">;
using Ids = gshard::Sharded<std::int64_t, M, "B D">;

auto bad(const Table& t, const Ids& i) { return gshard::take<"V">(t, i); }

int main() { return 0; }
