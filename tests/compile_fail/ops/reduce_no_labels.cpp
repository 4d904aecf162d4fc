// expect-error: no_labels_to_reduce<gshard::literal<5>{"mean"}
// No label to reduce over.
#include <gshard/gshard.hpp>
#include <gshard/ops/reduce.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B:x S:y M">;

auto bad(const X& x) { return gshard::mean<"">(x); }

int main() { return 0; }
