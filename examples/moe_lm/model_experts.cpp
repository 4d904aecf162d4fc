// The main job's experts (dispatch, expert FFNs, combine), compiled once (model.hpp).
#include "model.hpp"

template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::experts_block(
    const X&, const Groups&, const Routing&, std::int64_t) const;
