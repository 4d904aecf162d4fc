// expect-error: operands_differ_in_element_type<gshard::literal<4>{"mul"}>
// float and double tensors do not mix silently: cast one of them.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data">;
using X = gshard::Sharded<float, M, "G:data S">;
using Y = gshard::Sharded<double, M, "G:data S">;

auto bad(const X& x, const Y& y) { return x * y; }

int main() { return 0; }
