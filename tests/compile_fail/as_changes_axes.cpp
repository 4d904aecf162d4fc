// expect-error: renamed_layout_must_keep_axes<gshard::literal<11>{"G:data S M"}, gshard::literal<13>{"A:expert B C"}>
// .as<"A:expert B C">() on "G:data S M" renames labels but also moves G from data to expert.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return x.as<"A:expert B C">(); }

int main() { return 0; }
