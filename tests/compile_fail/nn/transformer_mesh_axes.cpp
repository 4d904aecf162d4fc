// expect-error: transformer_mesh_needs_data_and_expert_axes<gshard::Mesh<
// The Transformer LM on a mesh whose axes are not named "data" and "expert".
#include <gshard/nn/transformer.hpp>

using M = gshard::Mesh<"rows", "cols">;
using LM = gshard::nn::TransformerLM<float, M, true>;

int main() { return sizeof(LM::Tokens) > 0 ? 0 : 1; }
