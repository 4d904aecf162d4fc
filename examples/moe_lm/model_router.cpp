// The main job's MoE routers, compiled once (model.hpp).
#include "model.hpp"

template moe_lm::Model::Routing gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::router_block(
    const Groups&, std::int64_t, std::int64_t, std::uint64_t) const;
