// expect-error: gradient_layout_differs_from_parameter<gshard::literal<6>{"I:x J"}, gshard::literal<6>{"I J:x"}>
// A gradient in another layout than its parameter: the optimizer does not reshard it silently.
#include <gshard/nn/optimizers.hpp>

#include <tuple>

using M = gshard::Mesh<"x">;
using P = gshard::Sharded<float, M, "I:x J">;
using G = gshard::Sharded<float, M, "I J:x">;

void bad(P& p, G& g) {
  gshard::nn::AdamW opt;
  opt.step(std::tie(p), std::tie(g));
}

int main() { return 0; }
