// The main job's block loop, output projection and loss, compiled once (model.hpp).
#include "model.hpp"

template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::blocks(
    X, std::uint64_t, std::optional<Scalar>*, std::optional<Scalar>*,
    gshard::nn::TransformerStats*) const;
template moe_lm::Model::Logits gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::project(
    const X&) const;
template gshard::nn::TransformerLoss<moe_lm::Model::Scalar>
gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::loss_of(const Logits&, const Tokens&,
                                                               const std::optional<Scalar>&,
                                                               const std::optional<Scalar>&,
                                                               gshard::nn::TransformerStats) const;
