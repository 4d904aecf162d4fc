#pragma once
// The part every optimizer shares (nn/optimizers.hpp): checks of parameters and gradients, the
// per-parameter state made on the first step, the step count, in-place update bookkeeping (shard
// versions), and saving and restoring the state.
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../../core/error.hpp"
#include "../../tensor/sharded.hpp"
#include "../diagnostics.hpp"
#include "../schedules.hpp"

namespace gshard::nn::detail {

// The optimizers' device kernels (sgd.hpp, adam.hpp, adafactor.hpp) are templated only on element
// types, at namespace scope: nvcc rejects extended lambdas inside generic lambdas and private
// members, and cannot emit host stubs for kernels whose enclosing templates carry Sharded or Mesh
// types.

// --- the driver every optimizer shares ----------------------------------------------------------

struct SlotBase {
  virtual ~SlotBase() = default;
  Shape shape;
};

template <class P, class State>
struct Slot : SlotBase {
  State state;
};

template <class P>
void check_parameter_type() {
  using gshard::detail::shown;
  if constexpr (!ShardedTensor<P>) {
    static_assert(sizeof(nn_error::needs_sharded_tensor<shown<fixed_string("optimizer")>, P>) == 0);
  } else if constexpr (!std::is_floating_point_v<typename P::value_type>) {
    static_assert(
        sizeof(nn_error::needs_floating_point<shown<fixed_string("optimizer")>, shown<P::spec>>) ==
        0);
  } else if constexpr (P::layout.partial_count != 0) {
    static_assert(
        sizeof(nn_error::holds_partial_sums<shown<fixed_string("optimizer")>, shown<P::spec>>) ==
        0);
  }
}

template <class P, class G>
void check_gradient_type() {
  if constexpr (!std::is_same_v<std::remove_cv_t<P>, std::remove_cv_t<G>>) {
    static_assert(sizeof(nn_error::gradient_layout_differs_from_parameter<
                         gshard::detail::shown<P::spec>, gshard::detail::shown<G::spec>>) == 0);
  }
}

inline std::string parameter_text(std::size_t i, const std::string& what) {
  return "parameter " + std::to_string(i) + " (" + what + ")";
}

/// Checks, then creates the state on the first step (make_state(param) -> State<P>), then calls
/// update(param, grad, state, step) for each parameter in order. Every check depends only on
/// types and global shapes, so every rank throws alike, before any collective.
class Driver {
 public:
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

  template <template <class> class State, class MakeState, class Update, class... P, class... G>
  void run(const char* op, const std::tuple<P&...>& params, const std::tuple<G&...>& grads,
           MakeState&& make_state, Update&& update) {
    // One diagnostic per mistake: nothing below is instantiated once a type is wrong.
    if constexpr (sizeof...(P) != sizeof...(G)) {
      static_assert(sizeof(nn_error::one_gradient_per_parameter<sizeof...(P), sizeof...(G)>) == 0);
    } else if constexpr (!(std::is_same_v<std::remove_cv_t<P>, std::remove_cv_t<G>> && ...)) {
      (check_gradient_type<P, G>(), ...);
    } else {
      (check_parameter_type<std::remove_cv_t<P>>(), ...);
      check_all<State>(op, params, grads, std::index_sequence_for<P...>{});
      if (slots_.empty() && sizeof...(P) > 0)
        make_all<State>(params, make_state, std::index_sequence_for<P...>{});
      const std::int64_t t = steps_ + 1;
      update_all<State>(params, grads, update, t, std::index_sequence_for<P...>{});
      std::apply([&](const auto&... p) { (gshard::detail::mark_updated(p, op), ...); }, params);
      steps_ = t;
    }
  }

  /// f(i, state) for each parameter's state, after the same checks as a step (none before the
  /// first step).
  template <template <class> class State, class... P, class F>
  void visit(const char* op, const std::tuple<P&...>& params, F&& f) {
    if (steps_ == 0) return;
    check_all<State>(op, params, params, std::index_sequence_for<P...>{});
    visit_all<State>(params, f, std::index_sequence_for<P...>{});
  }

  /// The state of a first step and the step count `steps` (0: none), to be filled from a
  /// checkpoint.
  template <template <class> class State, class... P, class MakeState>
  void restore(const std::tuple<P&...>& params, MakeState&& make_state, std::int64_t steps) {
    (check_parameter_type<std::remove_cv_t<P>>(), ...);
    slots_.clear();
    steps_ = 0;
    if (steps > 0 && sizeof...(P) > 0)
      make_all<State>(params, make_state, std::index_sequence_for<P...>{});
    steps_ = steps;
  }

 private:
  template <template <class> class State, class... P, class... G, std::size_t... I>
  void check_all(const char* op, const std::tuple<P&...>& params, const std::tuple<G&...>& grads,
                 std::index_sequence<I...>) {
    if (steps_ > 0 && slots_.size() != sizeof...(P))
      throw Error(op, "step " + std::to_string(steps_ + 1) + " got " +
                          std::to_string(sizeof...(P)) +
                          " parameters, but the optimizer's state "
                          "was made for " +
                          std::to_string(slots_.size()) +
                          " on its first step; use one optimizer per set of parameters");
    (check_one<State>(op, I, std::get<I>(params), std::get<I>(grads)), ...);
  }

  template <template <class> class State, class P>
  void check_one(const char* op, std::size_t i, const P& p, const P& g) const {
    using S = std::remove_cv_t<P>;
    if (g.shape() != p.shape())
      throw Error(op, "the gradient of " + parameter_text(i, p.describe()) + " has global shape " +
                          gshard::detail::shape_string(g.shape()) + "; it must be " +
                          gshard::detail::shape_string(p.shape()));
    if (&gshard::detail::mesh_state(g.mesh()) != &gshard::detail::mesh_state(p.mesh()))
      throw Error(op, "the gradient of " + parameter_text(i, p.describe()) +
                          " lives on another mesh than the parameter");
    if (steps_ == 0) return;
    const SlotBase* slot = slots_[i].get();
    if (dynamic_cast<const Slot<S, State<S>>*>(slot) == nullptr)
      throw Error(op, parameter_text(i, p.describe()) +
                          " has another type (element type, mesh or layout) than at the first "
                          "step; use one optimizer per set of parameters");
    if (slot->shape != p.shape())
      throw Error(op, parameter_text(i, p.describe()) + " had global shape " +
                          gshard::detail::shape_string(slot->shape) +
                          " at the first step; the optimizer's state has that shape");
  }

  template <template <class> class State, class... P, class MakeState, std::size_t... I>
  void make_all(const std::tuple<P&...>& params, MakeState& make_state, std::index_sequence<I...>) {
    (slots_.push_back(make_slot<State>(std::get<I>(params), make_state)), ...);
  }

  template <template <class> class State, class P, class MakeState>
  static std::unique_ptr<SlotBase> make_slot(const P& p, MakeState& make_state) {
    using S = std::remove_cv_t<P>;
    auto slot = std::make_unique<Slot<S, State<S>>>();
    slot->shape = p.shape();
    slot->state = make_state(p);
    return slot;
  }

  template <template <class> class State, class... P, class... G, class Update, std::size_t... I>
  void update_all(const std::tuple<P&...>& params, const std::tuple<G&...>& grads, Update& update,
                  std::int64_t t, std::index_sequence<I...>) {
    (update(std::get<I>(params), std::get<I>(grads),
            static_cast<Slot<std::remove_cv_t<P>, State<std::remove_cv_t<P>>>&>(*slots_[I]).state,
            t),
     ...);
  }

  template <template <class> class State, class... P, class F, std::size_t... I>
  void visit_all(const std::tuple<P&...>&, F& f, std::index_sequence<I...>) {
    (f(I, static_cast<Slot<std::remove_cv_t<P>, State<std::remove_cv_t<P>>>&>(*slots_[I]).state),
     ...);
  }

  std::vector<std::unique_ptr<SlotBase>> slots_;
  std::int64_t steps_ = 0;
};

/// Adds the driver's state to a checkpoint: tensors "<prefix><i>.<slot>", metadata
/// "<prefix>steps".
template <template <class> class State, class Writer, class... P>
void save_state(const char* op, Driver& driver, Writer& w, const std::tuple<P&...>& params,
                const std::string& prefix) {
  w.set_metadata(prefix + "steps", std::to_string(driver.steps()));
  driver.visit<State>(op, params, [&](std::size_t i, auto& state) {
    state.each([&](const char* slot, const auto& t) {
      if (t) w.add(prefix + std::to_string(i) + "." + slot, *t);
    });
  });
}

/// Restores what save_state wrote, onto the parameters' mesh and layouts. Collective.
template <template <class> class State, class Reader, class... P, class MakeState>
void load_state(const char* op, Driver& driver, const Reader& r, const std::tuple<P&...>& params,
                const std::string& prefix, MakeState&& make_state) {
  const std::string& text = r.metadata(prefix + "steps");
  std::int64_t steps = -1;
  if (!text.empty() && text.size() < 19 &&
      text.find_first_not_of("0123456789") == std::string::npos)
    steps = std::stoll(text);
  if (steps < 0)
    throw Error(
        op, "checkpoint metadata \"" + prefix + "steps\" is \"" + text + "\", not a step count");
  driver.restore<State>(params, make_state, steps);
  driver.visit<State>(op, params, [&](std::size_t i, auto& state) {
    state.each([&](const char* slot, auto& t) {
      if (t) r.read_into(prefix + std::to_string(i) + "." + slot, *t);
    });
  });
}

inline void check_rate(const char* op, double lr, std::int64_t t) {
  if (!std::isfinite(lr))
    throw Error(op, "the learning rate at step " + std::to_string(t) + " is " + std::to_string(lr) +
                        "; it must be finite");
}

template <class T>
using View = Kokkos::View<T*>;

inline Kokkos::RangePolicy<> range(std::int64_t n) { return Kokkos::RangePolicy<>(0, n); }

template <class T>
std::int64_t extent(const View<T>& v) {
  return static_cast<std::int64_t>(v.extent(0));
}

/// What every optimizer shares: the step count, and saving and restoring its state (the state
/// type State<P> per parameter, made by Derived::make_state). Writer and Reader are
/// io::SafetensorsWriter and io::SafetensorsReader (io/safetensors.hpp); this header does not
/// include them, so a program that never checkpoints does not parse the file formats.
template <class Derived, template <class> class State>
class OptimizerBase {
 public:
  [[nodiscard]] std::int64_t steps() const noexcept { return driver_.steps(); }

  /// Adds the state to a checkpoint: tensors "<prefix><i>.<slot>", metadata "<prefix>steps".
  template <class Writer, class... P>
  void save(Writer& w, std::tuple<P&...> params, const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer save");
    save_state<State>(Derived::name, driver_, w, params, prefix);
  }
  /// Restores what save() wrote, onto `params`' mesh and layouts (any mesh may have saved it).
  template <class Reader, class... P>
  void load(const Reader& r, std::tuple<P&...> params, const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer load");
    load_state<State>(Derived::name, driver_, r, params, prefix, [this](const auto& p) {
      return static_cast<const Derived*>(this)->make_state(p);
    });
  }

 protected:
  Driver driver_;
};

}  // namespace gshard::nn::detail
