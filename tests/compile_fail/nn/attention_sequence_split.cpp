// expect-error: attention_sequence_or_head_size_split<gshard::literal<10>{"B S:x N D"}>
// The sequence must not be split: split the batch or the heads.
#include <gshard/nn/attention.hpp>

using M = gshard::Mesh<"x">;
using Q = gshard::Sharded<float, M, "B S:x N D">;
using KV = gshard::Sharded<float, M, "B T N D">;

auto bad(const Q& q, const KV& k, const KV& v) {
  return gshard::nn::scaled_dot_product_attention(q, k, v);
}

int main() { return 0; }
