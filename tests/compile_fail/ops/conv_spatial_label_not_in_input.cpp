// expect-error: label_not_in_input<gshard::literal<2>{"T"}, gshard::literal<13>{"B C H:data W"}>
// A spatial label the input does not have.
#include <gshard/ops/conv.hpp>

using M = gshard::Mesh<"data", "model">;
using X = gshard::Sharded<float, M, "B C H:data W">;
using W = gshard::Sharded<float, M, "O C K L">;

auto bad(const X& x, const W& w) { return gshard::conv2d<"H:K T:L C->O">(x, w); }

int main() { return 0; }
