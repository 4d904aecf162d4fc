// expect-error: attention_operand_labels<gshard::literal<2>{"k"}, gshard::literal<10>{"B:x S N D"}, gshard::literal<8>{"B T N D"}>
// k and v must be "B T N D": here k reuses q's S.
#include <gshard/nn/attention.hpp>

using M = gshard::Mesh<"x">;
using Q = gshard::Sharded<float, M, "B:x S N D">;
using KV = gshard::Sharded<float, M, "B:x T N D">;

auto bad(const Q& q, const KV& v) { return gshard::nn::scaled_dot_product_attention(q, q, v); }

int main() { return 0; }
