// expect-error: give_exactly_one_label<gshard::literal<3>{"GS"}
// pad takes one label, not two.
#include <gshard/ops/shape.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return gshard::pad<"GS">(x, 1, 1); }

int main() { return 0; }
