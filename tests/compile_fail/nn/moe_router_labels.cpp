// expect-error: moe_operand_labels<gshard::literal<3>{"wg"}, gshard::literal<8>{"M F:exp"}, gshard::literal<4>{"M E"}>
// The router must be "M E": here its expert label is F.
#include <gshard/nn/moe.hpp>

using M = gshard::Mesh<"exp">;
using X = gshard::Sharded<float, M, "G:exp S M">;
using Wg = gshard::Sharded<float, M, "M F:exp">;
using Wi = gshard::Sharded<float, M, "E:exp M H">;
using Wo = gshard::Sharded<float, M, "E:exp H M">;

auto bad(const X& x, const Wg& wg, const Wi& wi, const Wo& wo) {
  return gshard::nn::moe(x, wg, wi, wo);
}

int main() { return 0; }
