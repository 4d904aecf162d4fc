// expect-error: wrong_spatial_label_count<gshard::literal<13>{"H:K W:L C->O"}, 1>
// conv1d with two sliding labels (conv2d's spec).
#include <gshard/ops/conv.hpp>

using M = gshard::Mesh<"data", "model">;
using X = gshard::Sharded<float, M, "B C H:data W">;
using W = gshard::Sharded<float, M, "O C K L">;

auto bad(const X& x, const W& w) { return gshard::conv1d<"H:K W:L C->O">(x, w); }

int main() { return 0; }
