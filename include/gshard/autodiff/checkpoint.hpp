#pragma once
// Rematerialisation: gshard::checkpoint(block, std::tie(inputs...)) runs a block's forward pass
// without recording it, so its intermediates are freed at once, and records one node that keeps
// only the block's inputs. The node's backward reruns the block on them with recording on and
// back-propagates through that fresh graph into the inputs: memory for compute, as in GShard's
// and GSPMD's rematerialisation of Transformer layers.
#include <array>
#include <cstdint>
#include <optional>
#include <source_location>
#include <tuple>
#include <utility>
#include <vector>

#include "grad.hpp"

namespace gshard {

namespace detail {

/// Recording on while it lives, inside a backward pass (which turns it off).
class RecordingOn {
 public:
  RecordingOn() : saved_(no_grad_depth()) { no_grad_depth() = 0; }
  ~RecordingOn() { no_grad_depth() = saved_; }
  RecordingOn(const RecordingOn&) = delete;
  RecordingOn& operator=(const RecordingOn&) = delete;

 private:
  int saved_;
};

template <class E>
auto evaluated(const E& e) {
  if constexpr (E::is_lazy)
    return e.eval();
  else
    return e;
}

/// True when there is at least one input and each is a Sharded tensor; otherwise the named
/// diagnostic for the first that is not.
template <class... X>
constexpr bool check_checkpoint_inputs() {
  if constexpr (sizeof...(X) == 0) {
    return sizeof(autodiff_error::no_parameters<shown<fixed_string("checkpoint")>, X...>) == 0;
  } else {
    return ([] {
      if constexpr (is_sharded_v<X>)
        return true;
      else
        return sizeof(autodiff_error::checkpoint_input_must_be_a_tensor<X>) == 0;
    }() && ...);
  }
}

template <class F, class... X>
auto checkpoint_impl(F block, std::source_location where, const X&... inputs) {
  using Returned = decltype(block(inputs...));
  if constexpr (!Expression<Returned>)
    static_assert(sizeof(autodiff_error::checkpoint_block_must_return_one_tensor<Returned>) == 0);
  using R = decltype(evaluated(block(inputs...)));
  using T = typename R::value_type;
  const bool tracked = recording() && (static_cast<bool>(inputs.grad_node()) || ...);
  if (!tracked || !differentiable_v<T>) return evaluated(block(inputs...));
  R out = [&] {
    NoGrad off;
    return evaluated(block(inputs...));
  }();
  RuntimeTensor<T> r = runtime_tensor(out);
  // Only the inputs are kept, without their nodes (the checkpoint node holds those).
  std::tuple<X...> saved(inputs...);
  std::apply([](auto&... s) { (set_grad_node(s, nullptr), ...); }, saved);
  const std::array<bool, sizeof...(X)> was_tracked{static_cast<bool>(inputs.grad_node())...};
  record(out.mesh(), r, "checkpoint", where, {inputs.grad_node()...},
         [block, saved, was_tracked, where](const RuntimeTensor<T>& g) -> Cotangents {
           RecordingOn on;
           const std::uint64_t floor = next_node_sequence();
           std::tuple<X...> fresh = saved;
           std::vector<GradNode*> targets;
           [&]<std::size_t... I>(std::index_sequence<I...>) {
             (
                 [&](auto& x) {
                   if constexpr (trackable_v<std::decay_t<decltype(x)>>) {
                     if (was_tracked[I]) {
                       track_one(x, where);
                       targets.push_back(x.grad_node().get());
                     }
                   }
                 }(std::get<I>(fresh)),
                 ...);
           }
           (std::index_sequence_for<X...>{});
           const R again =
               std::apply([&](const X&... xs) { return evaluated(block(xs...)); }, fresh);
           Cotangents outs(sizeof...(X));
           if (!again.grad_node()) return outs;
           const auto cot = backprop(again.grad_node(), AnyTensor(g), targets, floor);
           std::size_t t = 0;
           for (std::size_t i = 0; i < sizeof...(X); ++i)
             if (was_tracked[i]) outs[i] = cot[t++];
           return outs;
         });
  return sharded_from<R>(out.mesh(), r);
}

}  // namespace detail

/// The value of `block(inputs...)` (one tensor or expression), computed without keeping the
/// block's intermediates for the backward pass: they are recomputed there. Every tracked tensor
/// the block reads (its weights too) must be among `inputs` (several: std::tie(x, w1, w2); one:
/// bare); the block must be deterministic (random ops with a fixed seed are). Collective over the
/// mesh, like the block.
template <class F, class... X>
auto checkpoint(F block, std::tuple<X&...> inputs,
                std::source_location where = std::source_location::current()) {
  static_assert(detail::check_checkpoint_inputs<std::remove_const_t<X>...>());
  // No UserSite: errors inside the block name the user's lines there; `where` names the node.
  return std::apply(
      [&](const X&... xs) { return detail::checkpoint_impl(std::move(block), where, xs...); },
      inputs);
}
template <class F, ShardedTensor X>
auto checkpoint(F block, const X& input,
                std::source_location where = std::source_location::current()) {
  return checkpoint(std::move(block), std::tie(input), where);
}

}  // namespace gshard
