// The main job's dense feed-forward blocks and its MoE blocks' glue (layer norm, losses),
// compiled once (model.hpp).
#include "model.hpp"

template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::dense_block(
    const X&, std::int64_t, std::int64_t) const;
template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::moe_block(
    const X&, std::int64_t, std::int64_t, std::uint64_t, std::optional<Scalar>*,
    std::optional<Scalar>*, gshard::nn::TransformerStats*) const;
