// expect-error: scan_label_not_in_input<gshard::literal<2>{"T"}, gshard::literal<6>{"B S:y"}>
// cumsum over a label the input does not have.
#include <gshard/gshard.hpp>
#include <gshard/ops/scan.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B S:y">;

auto bad(const X& x) { return gshard::cumsum<"T">(x); }

int main() { return 0; }
