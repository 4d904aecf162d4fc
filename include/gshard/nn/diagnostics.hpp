#pragma once
// Compile-time diagnostics of the nn layer, in the style of core/diagnostics.hpp: each mistake
// instantiates a template whose name says what is wrong and whose arguments are the offending
// layout (or type), so it is the first line of the compiler's error.
#include "../core/fixed_string.hpp"

namespace gshard::nn_error {

template <class>
inline constexpr bool always_false = false;

/// nn::moe: the tokens, router or expert weights do not have the labels the layer needs.
template <auto Operand, auto Spec, auto Needed>
struct moe_operand_labels {
  static_assert(always_false<moe_operand_labels>,
                "gshard::nn::moe: an operand has the wrong labels (operand, its spec, the labels "
                "it needs in that order: tokens \"G S M\", router \"M E\", experts \"E M H\" and "
                "\"E H M\" with E first)");
};
/// nn::moe: the tokens' S (tokens per group) is split over a mesh axis.
template <auto Spec>
struct moe_tokens_split_along_S {
  static_assert(always_false<moe_tokens_split_along_S>,
                "gshard::nn::moe: S (tokens per group) must not be split; split G instead");
};
/// nn::moe: the tokens hold pending partial sums.
template <auto Spec>
struct moe_tokens_hold_partial_sums {
  static_assert(always_false<moe_tokens_hold_partial_sums>,
                "gshard::nn::moe: finish the tokens' pending partial sums (reshard) first");
};

/// nn::scaled_dot_product_attention: an operand does not have the labels it needs, in order.
template <auto Operand, auto Spec, auto Needed>
struct attention_operand_labels {
  static_assert(always_false<attention_operand_labels>,
                "gshard::nn::scaled_dot_product_attention: an operand has the wrong labels "
                "(operand, its spec, the labels it needs in that order: q \"B S N D\", k and v "
                "\"B T N D\")");
};
/// nn::scaled_dot_product_attention: q's sequence S or head size D is split over a mesh axis.
template <auto Spec>
struct attention_sequence_or_head_size_split {
  static_assert(always_false<attention_sequence_or_head_size_split>,
                "gshard::nn::scaled_dot_product_attention: S (the sequence) and D (the head size) "
                "must not be split; split B or N instead");
};
/// Optimizers and clipping (Op names which): a parameter or gradient is not a Sharded tensor.
template <auto Op, class Type>
struct needs_sharded_tensor {
  static_assert(always_false<needs_sharded_tensor>,
                "gshard::nn: pass gshard::Sharded tensors (evaluate lazy expressions first)");
};
/// Optimizers and clipping: a parameter or gradient of integer elements.
template <auto Op, auto Spec>
struct needs_floating_point {
  static_assert(always_false<needs_floating_point>,
                "gshard::nn: parameters and gradients must be float or double");
};
/// Optimizers and clipping: a parameter or gradient with pending partial sums ("+axis").
template <auto Op, auto Spec>
struct holds_partial_sums {
  static_assert(always_false<holds_partial_sums>,
                "gshard::nn: a tensor with pending partial sums (\"+axis\") has no value yet; "
                "reshard it to a layout without them first");
};
/// Optimizers: a gradient whose type (element type, mesh or layout) is not its parameter's.
template <auto ParameterSpec, auto GradientSpec>
struct gradient_layout_differs_from_parameter {
  static_assert(always_false<gradient_layout_differs_from_parameter>,
                "gshard::nn optimizers: each gradient must have its parameter's type (element "
                "type, mesh and layout); reshard it to the parameter's layout first");
};
/// Optimizers: not one gradient per parameter.
template <class Mesh>
struct transformer_mesh_needs_data_and_expert_axes {
  static_assert(always_false<transformer_mesh_needs_data_and_expert_axes>,
                "gshard::nn::TransformerLM: the mesh needs axes named \"data\" and \"expert\" "
                "(\"model\" optional); the mesh given is the argument");
};
template <auto Parameters, auto Gradients>
struct one_gradient_per_parameter {
  static_assert(always_false<one_gradient_per_parameter>,
                "gshard::nn optimizers: give one gradient per parameter (counts above)");
};

}  // namespace gshard::nn_error
