// expect-error: new_label_already_in_operand<gshard::literal<2>{"M"}
// Merging G and S into a label the operand already has for another dimension.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return gshard::merge<"GS", "M">(x); }

int main() { return 0; }
