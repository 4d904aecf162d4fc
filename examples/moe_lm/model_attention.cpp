// The main job's attention blocks, compiled once (model.hpp).
#include "model.hpp"

template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::attention_block(
    const X&, std::int64_t) const;
