// expect-error: implicit_collective<gshard::literal<7>{"conv2d"}, 1, gshard::literal<13>{"O C K:data L"}, gshard::literal<8>{"O C K L"}>
// Strict mode: weights split over a kernel label must be gathered, an implicit collective.
#define GSHARD_STRICT
#include <gshard/ops/conv.hpp>

using M = gshard::Mesh<"data", "model">;
using X = gshard::Sharded<float, M, "B C H W:model">;
using W = gshard::Sharded<float, M, "O C K:data L">;

auto bad(const X& x, const W& w) { return gshard::conv2d<"H:K W:L C->O">(x, w); }

int main() { return 0; }
