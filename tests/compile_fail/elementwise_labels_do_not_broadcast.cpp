// expect-error: operand_labels_do_not_broadcast<gshard::literal<4>{"add"}, gshard::literal<4>{"G T"}, gshard::literal<11>{"G:data S M"}>
// Broadcasting is by label: "G T" is not a subset of "G S M", nor the other way round.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data">;
using X = gshard::Sharded<float, M, "G:data S M">;
using Y = gshard::Sharded<float, M, "G T">;

auto bad(const X& x, const Y& y) { return x + y; }

int main() { return 0; }
