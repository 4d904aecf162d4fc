// expect-error: along_batch_label_not_in_indices<gshard::literal<2>{"H"}
// scatter_add_along with a batch label the indices lack.
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Values = gshard::Sharded<float, M, "G:x H E M">;
using Ids = gshard::Sharded<std::int64_t, M, "G:x E">;

auto bad(const Values& v, const Ids& i) { return gshard::scatter_add_along<"S", "H">(v, i, 10); }

int main() { return 0; }
