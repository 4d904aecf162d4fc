// expect-error: weight_labels_differ_from_conv_spec<gshard::literal<13>{"H:K W:L C->O"}, gshard::literal<8>{"O C K J"}>
// Weights without the kernel label L of the spec.
#include <gshard/ops/conv.hpp>

using M = gshard::Mesh<"data", "model">;
using X = gshard::Sharded<float, M, "B C H:data W">;
using W = gshard::Sharded<float, M, "O C K J">;

auto bad(const X& x, const W& w) { return gshard::conv2d<"H:K W:L C->O">(x, w); }

int main() { return 0; }
