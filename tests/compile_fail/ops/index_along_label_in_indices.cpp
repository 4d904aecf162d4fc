// expect-error: along_label_in_indices<gshard::literal<2>{"S"}
// take_along<"S"> with S also a label of the indices: which S would the result's rows use?
#include <gshard/gshard.hpp>
#include <gshard/ops/index.hpp>

using M = gshard::Mesh<"x", "y">;
using Table = gshard::Sharded<float, M, "G:x S M">;
using Ids = gshard::Sharded<std::int32_t, M, "G:x S C">;

auto bad(const Table& t, const Ids& i) { return gshard::take_along<"S">(t, i); }

int main() { return 0; }
