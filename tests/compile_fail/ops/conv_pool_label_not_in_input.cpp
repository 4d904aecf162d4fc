// expect-error: label_not_in_input<gshard::literal<2>{"Q"}, gshard::literal<13>{"B C H:data W"}>
// Pooling over a label the input does not have.
#include <gshard/ops/conv.hpp>

using M = gshard::Mesh<"data", "model">;
using X = gshard::Sharded<float, M, "B C H:data W">;

auto bad(const X& x) { return gshard::max_pool<"HQ">(x, {.window = {2, 2}}); }

int main() { return 0; }
