// expect-error: concat_operands_differ_in_labels<gshard::literal<11>{"G:data S M"}, gshard::literal<6>{"G S H"}
// Concatenating tensors whose labels differ.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;
using Y = gshard::Sharded<float, M, "G S H">;

auto bad(const X& x, const Y& y) { return gshard::concat<"S">(x, y); }

int main() { return 0; }
