// expect-error: give_two_or_more_labels<gshard::literal<2>{"G"}
// Merging a single label.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return gshard::merge<"G", "T">(x); }

int main() { return 0; }
