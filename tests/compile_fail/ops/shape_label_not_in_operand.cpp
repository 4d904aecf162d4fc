// expect-error: label_not_in_operand<gshard::literal<2>{"Q"}
// Slicing along a label the operand does not have.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return gshard::slice<"Q">(x, 0, 1); }

int main() { return 0; }
