#pragma once
// Rematerialisation: gshard::checkpoint(block, inputs...) runs a block's forward pass without
// recording it, so its intermediates are freed at once, and records one node that keeps only the
// block's inputs. The node's backward reruns the block on them with recording on and
// back-propagates through that fresh graph into the inputs: memory for compute, as in GShard's
// and GSPMD's rematerialisation of Transformer layers.
#include <array>
#include <cstdint>
#include <optional>
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

}  // namespace detail

/// The value of `block(inputs...)` (one tensor or expression), computed without keeping the
/// block's intermediates for the backward pass: they are recomputed there. Every tracked tensor
/// the block reads (its weights too) must be among `inputs`; the block must be deterministic
/// (random ops with a fixed seed are). Collective over the mesh, like the block.
template <class F, class... X>
auto checkpoint(F block, const X&... inputs) {
  static_assert(sizeof...(X) > 0, "gshard::checkpoint: pass the block's inputs after it");
  static_assert((detail::is_sharded_v<X> && ...),
                "gshard::checkpoint: the block's inputs must be Sharded tensors");
  using R = decltype(detail::evaluated(block(inputs...)));
  static_assert(detail::is_sharded_v<R>,
                "gshard::checkpoint: the block must return one tensor (or expression)");
  using T = typename R::value_type;
  const bool tracked = detail::recording() && (static_cast<bool>(inputs.grad_node()) || ...);
  if (!tracked || !detail::differentiable_v<T>) return detail::evaluated(block(inputs...));
  R out = [&] {
    NoGrad off;
    return detail::evaluated(block(inputs...));
  }();
  detail::RuntimeTensor<T> r = detail::runtime_tensor(out);
  // Only the inputs are kept, without their nodes (the checkpoint node holds those).
  std::tuple<X...> saved(inputs...);
  std::apply([](auto&... s) { (detail::set_grad_node(s, nullptr), ...); }, saved);
  const std::array<bool, sizeof...(X)> was_tracked{static_cast<bool>(inputs.grad_node())...};
  detail::record(
      out.mesh(), r, "checkpoint", std::source_location{}, {inputs.grad_node()...},
      [block, saved, was_tracked](const detail::RuntimeTensor<T>& g) -> detail::Cotangents {
        detail::RecordingOn on;
        const std::uint64_t floor = detail::next_node_sequence();
        std::tuple<X...> fresh = saved;
        std::vector<detail::GradNode*> targets;
        [&]<std::size_t... I>(std::index_sequence<I...>) {
          (
              [&](auto& x) {
                if constexpr (detail::trackable_v<std::decay_t<decltype(x)>>) {
                  if (was_tracked[I]) {
                    track(x);
                    targets.push_back(x.grad_node().get());
                  }
                }
              }(std::get<I>(fresh)),
              ...);
        }
        (std::index_sequence_for<X...>{});
        const R again =
            std::apply([&](const X&... xs) { return detail::evaluated(block(xs...)); }, fresh);
        detail::Cotangents outs(sizeof...(X));
        if (!again.grad_node()) return outs;
        const auto cot = detail::backprop(again.grad_node(), detail::AnyTensor(g), targets, floor);
        std::size_t t = 0;
        for (std::size_t i = 0; i < sizeof...(X); ++i)
          if (was_tracked[i]) outs[i] = cot[t++];
        return outs;
      });
  return detail::sharded_from<R>(out.mesh(), r);
}

}  // namespace gshard
