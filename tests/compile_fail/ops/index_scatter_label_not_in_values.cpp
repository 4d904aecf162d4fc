// expect-error: index_label_not_in_values<gshard::literal<2>{"Q"}
// scatter_add with an index label the values lack.
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Values = gshard::Sharded<float, M, "B:x S D">;
using Ids = gshard::Sharded<std::int32_t, M, "B Q">;

auto bad(const Values& v, const Ids& i) { return gshard::scatter_add<"V">(v, i, 10); }

int main() { return 0; }
