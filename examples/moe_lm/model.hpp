#pragma once
// The main job's model: one TransformerLM<float> on a data x expert x model mesh (a 2-axis --mesh
// gets model 1, so one instantiation serves every shape). Its forward pass is compiled once, in
// model_*.cpp (explicit instantiation, one block kind per translation unit, built in parallel);
// every other file sees only the extern declarations below, so no translation unit of the main job
// instantiates the whole model (docs/performance.md, compile times).
#include <cstdint>
#include <optional>
#include <vector>

#include <gshard/nn/transformer.hpp>

#include "corpus.hpp"
#include "options.hpp"

namespace moe_lm {

using MeshT = gshard::Mesh<"data", "expert", "model">;

/// The mesh of --mesh: data x expert [x model], model 1 when not given.
inline MeshT make_mesh(const std::vector<int>& shape, MPI_Comm comm = MPI_COMM_WORLD) {
  if (shape.size() < 2 || shape.size() > 3)
    throw gshard::Error("moe_lm::make_mesh", "a mesh shape has 2 or 3 extents");
  return MeshT(comm, {shape[0], shape[1], shape.size() == 3 ? shape[2] : 1});
}

/// The model of the options: head size d_model / heads, dense and expert FFNs of --ffn hidden
/// units, an MoE layer in every other block, GShard's top-2 gating with the random second
/// expert.
inline gshard::nn::TransformerConfig model_config(const Options& o) {
  gshard::nn::TransformerConfig c;
  c.vocab = kVocabulary;
  c.d_model = o.d_model;
  c.heads = o.heads;
  c.head_dim = o.d_model / o.heads;
  c.d_ff = o.ffn;
  c.layers = o.layers;
  c.max_len = o.context;
  c.experts = o.experts;
  c.expert_hidden = o.ffn;
  c.moe.k = 2;
  c.moe.capacity_factor = o.capacity_factor;
  c.moe.second_expert = gshard::nn::SecondExpert::random;
  c.moe.dropless = o.routing == "dropless";
  c.aux_loss_weight = o.balance == "bias" ? 0.0 : 1e-2;
  c.bias_rate = o.balance == "aux" ? 0.0 : o.bias_rate;
  // Small tied embedding (GPT-2's 0.02): logits start near 0, the loss near ln 256 = 5.55.
  c.embedding_sd = 0.02;
  return c;
}

using Model = gshard::nn::TransformerLM<float, MeshT, true>;

}  // namespace moe_lm

// The forward pass's pieces, compiled in model_attention.cpp, model_ffn.cpp, model_router.cpp,
// model_experts.cpp and model_loss.cpp (explicit instantiation of the members, not of the class:
// its inline members are instantiated where used, as usual).
extern template moe_lm::Model::X
gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::attention_block(const X&,
                                                                       std::int64_t) const;
extern template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::dense_block(
    const X&, std::int64_t, std::int64_t) const;
extern template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::moe_block(
    const X&, std::int64_t, std::int64_t, std::uint64_t, std::optional<Scalar>*,
    std::optional<Scalar>*, gshard::nn::TransformerStats*) const;
extern template moe_lm::Model::Routing
gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::router_block(const Groups&, std::int64_t,
                                                                    std::int64_t,
                                                                    std::uint64_t) const;
extern template moe_lm::Model::X
gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::experts_block(const X&, const Groups&,
                                                                     const Routing&,
                                                                     std::int64_t) const;
extern template moe_lm::Model::X gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::blocks(
    X, std::uint64_t, std::optional<Scalar>*, std::optional<Scalar>*,
    gshard::nn::TransformerStats*) const;
extern template moe_lm::Model::Logits
gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::project(const X&) const;
extern template gshard::nn::TransformerLoss<moe_lm::Model::Scalar>
gshard::nn::TransformerLM<float, moe_lm::MeshT, true>::loss_of(const Logits&, const Tokens&,
                                                               const std::optional<Scalar>&,
                                                               const std::optional<Scalar>&,
                                                               gshard::nn::TransformerStats) const;
