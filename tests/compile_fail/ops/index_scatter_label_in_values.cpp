// expect-error: scattered_label_already_in_values<gshard::literal<2>{"D"}
// scatter_add into a label the values already have.
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Values = gshard::Sharded<float, M, "B:x S D">;
using Ids = gshard::Sharded<std::int32_t, M, "B S">;

auto bad(const Values& v, const Ids& i) { return gshard::scatter_add<"D">(v, i, 10); }

int main() { return 0; }
