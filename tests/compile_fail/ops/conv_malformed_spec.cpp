// expect-error: malformed_conv_spec<gshard::literal<3>{"CO"}
// A conv spec whose channel part lacks "->".
#include <gshard/ops/conv.hpp>

using M = gshard::Mesh<"data", "model">;
using X = gshard::Sharded<float, M, "B C H:data W">;
using W = gshard::Sharded<float, M, "O C K L">;

auto bad(const X& x, const W& w) { return gshard::conv2d<"H:K W:L CO">(x, w); }

int main() { return 0; }
