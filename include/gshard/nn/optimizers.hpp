#pragma once
// Optimizers over sharded parameters: Sgd, Adam, AdamW, Adafactor.
//
//   gshard::nn::Adam opt({.learning_rate = nn::inverse_sqrt(1e-3, 4000)});
//   opt.step(std::tie(w1, w2), std::tie(g1, g2));   // w1, w2 updated in place
//
// Each gradient has its parameter's type (same layout) and global shape. State tensors
// (momentum, Adam's m and v, Adafactor's moments and row/column statistics) are created on the
// first step, sharded like their parameter (Adafactor's factored statistics like the parameter's
// kept labels); a later step with another count of parameters, other types or other shapes is an
// Error. Every rank updates its own block, so copies over replicated axes stay identical; padding
// stays zero. Sgd, Adam and AdamW never communicate. Adafactor's means and RMS values are over
// global values: per factored parameter and step, AllReduces over the axes of the last label
// (row statistics), of the second-to-last label (column statistics, then the mean of the row
// statistics), and one of 2 doubles over all the parameter's axes (RMS of the update and of the
// parameter); unfactored, only the last. Axis sets whose sizes multiply to 1 communicate nothing.
//
// Checkpoints: opt.save(writer, params) adds the state as tensors "optimizer.<i>.<slot>" and the
// step count as metadata "optimizer.steps" (io/safetensors.hpp); opt.load(reader, params) restores
// them onto the parameters' mesh and layouts, whatever mesh saved them.
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

#include "../core/error.hpp"
#include "diagnostics.hpp"
#include "../io/safetensors.hpp"
#include "../kernels/math.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/local_index.hpp"
#include "../tensor/sharded.hpp"
#include "clip.hpp"
#include "schedules.hpp"

namespace gshard::nn {

struct SgdOptions {
  LearningRate learning_rate = 0.01;
  double momentum = 0;
  bool nesterov = false;
  double weight_decay = 0;  // L2: wd * p added to the gradient
};

struct AdamOptions {
  LearningRate learning_rate = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double weight_decay = 0;
  /// true: p -= lr * wd * p before the Adam update (AdamW); false: wd * p added to the gradient.
  bool decoupled_weight_decay = false;
};

/// AdamOptions with decoupled weight decay on by default.
struct AdamWOptions {
  LearningRate learning_rate = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, epsilon = 1e-8;
  double weight_decay = 0;
  bool decoupled_weight_decay = true;
};

struct AdafactorOptions {
  /// None: the relative step min(1e-2, 1/sqrt(t)).
  std::optional<LearningRate> learning_rate{};
  double beta1 = 0;         // 0: no first moment
  double decay_rate = 0.8;  // beta2_t = 1 - t^(-decay_rate)
  double epsilon1 = 1e-30, epsilon2 = 1e-3;
  double clipping_threshold = 1.0;  // d in u /= max(1, RMS(u) / d)
  /// Scale the step by max(epsilon2, RMS(param)) (with a given rate too, as Mesh-TensorFlow).
  bool multiply_by_parameter_scale = true;
  double weight_decay = 0;  // p -= wd * lr_t * p
  bool factored = true;     // second moments factored over the last two labels (rank >= 2)
};

namespace detail {

// --- compile-time specs of the factored statistics ---------------------------------------------

template <std::size_t N>
struct SpecBuffer {
  char data[N]{};
  std::size_t n = 0;
};

// `text` without its piece number `drop` (pieces are separated by spaces), single-spaced.
template <std::size_t N>
constexpr SpecBuffer<N> drop_piece(std::string_view text, int drop) {
  SpecBuffer<N> out;
  int piece = -1;
  bool in_piece = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const bool space = text[i] == ' ';
    if (!space && !in_piece) {
      ++piece;
      if (out.n > 0 && piece != drop) out.data[out.n++] = ' ';
    }
    in_piece = !space;
    if (!space && piece != drop) out.data[out.n++] = text[i];
  }
  return out;
}

template <fixed_string Spec, int Drop>
constexpr auto spec_without() {
  constexpr auto built = drop_piece<Spec.size() + 1>(Spec.view(), Drop);
  fixed_string result;
  for (std::size_t i = 0; i < built.n; ++i) result.data[i] = built.data[i];
  return result;
}

template <class P>
struct FactoredTypes {
  using Row = P;  // unused below rank 2
  using Col = P;
};
template <class P>
requires(P::rank >= 2) struct FactoredTypes<P> {
  using Row =
      Sharded<typename P::value_type, typename P::mesh_type, spec_without<P::spec, P::rank - 1>()>;
  using Col =
      Sharded<typename P::value_type, typename P::mesh_type, spec_without<P::spec, P::rank - 2>()>;
};

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
    static_assert(sizeof(nn_error::needs_floating_point<shown<fixed_string("optimizer")>,
                                                        shown<P::spec>>) == 0);
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
    if (&g.mesh().state() != &p.mesh().state())
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
template <template <class> class State, class... P>
void save_state(const char* op, Driver& driver, io::SafetensorsWriter& w,
                const std::tuple<P&...>& params, const std::string& prefix) {
  w.set_metadata(prefix + "steps", std::to_string(driver.steps()));
  driver.visit<State>(op, params, [&](std::size_t i, auto& state) {
    state.each([&](const char* slot, const auto& t) {
      if (t) w.add(prefix + std::to_string(i) + "." + slot, *t);
    });
  });
}

/// Restores what save_state wrote, onto the parameters' mesh and layouts. Collective.
template <template <class> class State, class... P, class MakeState>
void load_state(const char* op, Driver& driver, const io::SafetensorsReader& r,
                const std::tuple<P&...>& params, const std::string& prefix,
                MakeState&& make_state) {
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

// In-place sum of a View of doubles over the axes in `mask` (through a host buffer MPI can use).
template <class MeshT>
void sum_view_over_axes(const MeshT& mesh, unsigned mask, const View<double>& v) {
  if (group_size_of(mask, mesh.sizes()) == 1 || v.extent(0) == 0) return;
  gshard::detail::MpiAccess<double> h(v, true);
  sum_over_axes(mesh, mask, h.data(), extent(v));
  h.copy_out();
}

// --- device kernels -----------------------------------------------------------------------------
// Templated only on element types, at namespace scope: nvcc rejects extended lambdas inside
// generic lambdas and private members, and cannot emit host stubs for kernels whose enclosing
// templates carry Sharded or Mesh types.

template <class T>
void sgd_update(const View<T>& pv, const View<T>& gv, const View<T>& bv, bool has_momentum,
                bool first, double mu, bool nesterov, double wd, double lr) {
  Kokkos::parallel_for(
      "gshard::nn::Sgd", range(extent(pv)), KOKKOS_LAMBDA(const std::int64_t i) {
        const double w = static_cast<double>(pv(i));
        double d = static_cast<double>(gv(i)) + wd * w;
        if (has_momentum) {
          const double b = first ? d : mu * static_cast<double>(bv(i)) + d;
          bv(i) = static_cast<T>(b);
          d = nesterov ? d + mu * b : b;
        }
        pv(i) = static_cast<T>(w - lr * d);
      });
}

struct AdamScalars {
  double lr, b1, b2, eps, wd, c1, c2;
  bool decoupled;
};

template <class T>
void adam_update(const View<T>& pv, const View<T>& gv, const View<T>& mv, const View<T>& vv,
                 const AdamScalars& a) {
  Kokkos::parallel_for(
      "gshard::nn::Adam", range(extent(pv)), KOKKOS_LAMBDA(const std::int64_t i) {
        double w = static_cast<double>(pv(i));
        double d = static_cast<double>(gv(i));
        if (a.decoupled)
          w *= 1 - a.lr * a.wd;
        else
          d += a.wd * w;
        const double m = a.b1 * static_cast<double>(mv(i)) + (1 - a.b1) * d;
        const double v = a.b2 * static_cast<double>(vv(i)) + (1 - a.b2) * d * d;
        mv(i) = static_cast<T>(m);
        vv(i) = static_cast<T>(v);
        pv(i) = static_cast<T>(w - a.lr * (m / a.c1) / (math::sqrt(v / a.c2) + a.eps));
      });
}

using gshard::detail::BlockIndex;

// Adafactor's local sums of g^2 over the valid columns of each (leading index, row) pair.
template <class T>
void adafactor_row_sums(const View<T>& gv, const BlockIndex& rb, std::int64_t C,
                        std::int64_t valid_c, const View<double>& row_sum) {
  Kokkos::parallel_for(
      "gshard::nn::Adafactor row sums", range(extent(row_sum)),
      KOKKOS_LAMBDA(const std::int64_t i) {
        if (rb.global_of(i) < 0) return;
        double s = 0;
        for (std::int64_t c = 0; c < valid_c; ++c) {
          const double x = static_cast<double>(gv(i * C + c));
          s += x * x;
        }
        row_sum(i) = s;
      });
}

// Adafactor's local sums of g^2 over the valid rows of each (leading index, column) pair.
template <class T>
void adafactor_column_sums(const View<T>& gv, const BlockIndex& cb, std::int64_t R, std::int64_t C,
                           std::int64_t valid_r, const View<double>& col_sum) {
  Kokkos::parallel_for(
      "gshard::nn::Adafactor column sums", range(extent(col_sum)),
      KOKKOS_LAMBDA(const std::int64_t j) {
        if (cb.global_of(j) < 0) return;
        const std::int64_t o = j / C;
        const std::int64_t c = j % C;
        double s = 0;
        for (std::int64_t r = 0; r < valid_r; ++r) {
          const double x = static_cast<double>(gv((o * R + r) * C + c));
          s += x * x;
        }
        col_sum(j) = s;
      });
}

// stat = b2 stat + (1 - b2)(sum * inv + eps1) on valid elements (row or column statistics).
template <class T>
void adafactor_statistics(const char* label, std::int64_t n, const View<T>& stat,
                          const BlockIndex& b, const View<double>& sum, double inv, double b2,
                          double eps1) {
  Kokkos::parallel_for(
      label, range(n), KOKKOS_LAMBDA(const std::int64_t i) {
        if (b.global_of(i) < 0) return;
        stat(i) =
            static_cast<T>(b2 * static_cast<double>(stat(i)) + (1 - b2) * (sum(i) * inv + eps1));
      });
}

// Local sums of the valid row statistics per leading index.
template <class T>
void adafactor_row_mean_sums(const View<T>& rowv, const BlockIndex& rb, std::int64_t R,
                             std::int64_t valid_r, const View<double>& means) {
  Kokkos::parallel_for(
      "gshard::nn::Adafactor row means", range(extent(means)), KOKKOS_LAMBDA(const std::int64_t o) {
        double s = 0;
        for (std::int64_t r = 0; r < valid_r; ++r)
          if (rb.global_of(o * R + r) >= 0) s += static_cast<double>(rowv(o * R + r));
        means(o) = s;
      });
}

inline void adafactor_scale_means(const View<double>& means, double inv_r) {
  Kokkos::parallel_for(
      "gshard::nn::Adafactor row means", range(extent(means)),
      KOKKOS_LAMBDA(const std::int64_t o) { means(o) *= inv_r; });
}

template <class T>
void adafactor_second_moment(std::int64_t n, const View<T>& vv, const View<T>& gv,
                             const BlockIndex& pb, double b2, double eps1) {
  Kokkos::parallel_for(
      "gshard::nn::Adafactor second moment", range(n), KOKKOS_LAMBDA(const std::int64_t i) {
        if (pb.global_of(i) < 0) return;
        const double x = static_cast<double>(gv(i));
        vv(i) = static_cast<T>(b2 * static_cast<double>(vv(i)) + (1 - b2) * (x * x + eps1));
      });
}

/// The preconditioned gradient u at local element i, from the state after this step's update.
template <class T>
struct AdafactorPreconditioned {
  View<T> g, rows, cols, second;
  View<double> means;
  std::int64_t RC = 1, C = 1;  // local padded extents of the last two labels
  bool factored = false;

  KOKKOS_INLINE_FUNCTION double operator()(const std::int64_t i) const {
    const double x = static_cast<double>(g(i));
    if (!factored) return x / math::sqrt(static_cast<double>(second(i)));
    const std::int64_t o = i / RC;
    const std::int64_t row = i / C;
    const std::int64_t col = o * C + i % C;
    const double r_factor = 1 / math::sqrt(static_cast<double>(rows(row)) / means(o));
    const double c_factor = 1 / math::sqrt(static_cast<double>(cols(col)));
    return x * r_factor * c_factor;
  }
};

// Local sum of u^2 over valid elements.
template <class T>
double adafactor_local_sum_u2(const AdafactorPreconditioned<T>& u, const BlockIndex& pb,
                              std::int64_t n) {
  double s = 0;
  Kokkos::parallel_reduce(
      "gshard::nn::Adafactor RMS", range(n),
      KOKKOS_LAMBDA(const std::int64_t i, double& acc) {
        if (pb.global_of(i) < 0) return;
        const double x = u(i);
        acc += x * x;
      },
      s);
  return s;
}

// mv is only read and written when first_moment.
template <class T>
void adafactor_update(const View<T>& pv, const View<T>& mv, const AdafactorPreconditioned<T>& u,
                      const BlockIndex& pb, double step_scale, bool first_moment, double b1,
                      double wd, double lr) {
  Kokkos::parallel_for(
      "gshard::nn::Adafactor update", range(extent(pv)), KOKKOS_LAMBDA(const std::int64_t i) {
        if (pb.global_of(i) < 0) return;
        double d = step_scale * u(i);
        if (first_moment) {
          d = b1 * static_cast<double>(mv(i)) + (1 - b1) * d;
          mv(i) = static_cast<T>(d);
        }
        const double w = static_cast<double>(pv(i));
        pv(i) = static_cast<T>(w - wd * lr * w - d);
      });
}

// --- state types --------------------------------------------------------------------------------

template <class P>
struct SgdState {
  std::optional<P> momentum;
  template <class F>
  void each(F&& f) {
    f("momentum", momentum);
  }
};

template <class P>
struct AdamState {
  std::optional<P> m, v;
  template <class F>
  void each(F&& f) {
    f("m", m);
    f("v", v);
  }
};

template <class P>
struct AdafactorState {
  std::optional<P> m;                                 // first moment (beta1 > 0)
  std::optional<P> v;                                 // unfactored second moment
  std::optional<typename FactoredTypes<P>::Row> row;  // mean over the last label
  std::optional<typename FactoredTypes<P>::Col> col;  // mean over the second-to-last label
  template <class F>
  void each(F&& f) {
    f("m", m);
    f("v", v);
    f("row", row);
    f("col", col);
  }
};

}  // namespace detail

/// Stochastic gradient descent as PyTorch's SGD (dampening 0): g' = g + wd * p; with momentum,
/// buf = g' at step 1, then mu * buf + g'; the step uses buf, or g' + mu * buf (Nesterov).
/// p -= lr(t) * step. No communication.
class Sgd {
 public:
  explicit Sgd(SgdOptions options = {}) : options_(std::move(options)) {
    if (options_.momentum < 0)
      throw Error("Sgd", "momentum " + std::to_string(options_.momentum) + " is negative");
    if (options_.nesterov && options_.momentum <= 0)
      throw Error("Sgd", "Nesterov momentum needs momentum > 0");
  }

  template <class... P, class... G>
  void step(std::tuple<P&...> params, std::tuple<G&...> grads,
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer step");
    const double mu = options_.momentum;
    const bool nesterov = options_.nesterov;
    const double wd = options_.weight_decay;
    const double lr_next = options_.learning_rate(driver_.steps() + 1);
    detail::check_rate("Sgd", lr_next, driver_.steps() + 1);
    driver_.run<detail::SgdState>(
        "Sgd", params, grads, [this](const auto& p) { return this->make_state(p); },
        [&](const auto& p, const auto& g, auto& state, std::int64_t t) {
          const auto& pv = p.local_view();
          const bool has_momentum = state.momentum.has_value();
          detail::sgd_update(pv, g.local_view(), has_momentum ? state.momentum->local_view() : pv,
                             has_momentum, t == 1, mu, nesterov, wd, lr_next);
        });
  }

  [[nodiscard]] std::int64_t steps() const noexcept { return driver_.steps(); }
  [[nodiscard]] const SgdOptions& options() const noexcept { return options_; }

  /// Adds the state to a checkpoint: tensors "<prefix><i>.<slot>", metadata "<prefix>steps".
  template <class... P>
  void save(io::SafetensorsWriter& w, std::tuple<P&...> params,
            const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer save");
    detail::save_state<detail::SgdState>("Sgd", driver_, w, params, prefix);
  }
  /// Restores what save() wrote, onto `params`' mesh and layouts (any mesh may have saved it).
  template <class... P>
  void load(const io::SafetensorsReader& r, std::tuple<P&...> params,
            const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer load");
    detail::load_state<detail::SgdState>("Sgd", driver_, r, params, prefix,
                                         [this](const auto& p) { return this->make_state(p); });
  }

 private:
  template <class S>
  detail::SgdState<S> make_state(const S& p) const {
    detail::SgdState<S> s;
    if (options_.momentum != 0) s.momentum.emplace(p.mesh(), p.shape());
    return s;
  }
  SgdOptions options_;
  detail::Driver driver_;
};

/// Adam (Kingma & Ba) with PyTorch's semantics: m = b1 m + (1-b1) g', v = b2 v + (1-b2) g'^2,
/// p -= lr(t) * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps); g' = g + wd * p, or with decoupled
/// weight decay (AdamW) g' = g and p *= 1 - lr(t) * wd first. No communication.
class Adam {
 public:
  explicit Adam(AdamOptions options = {}) : options_(std::move(options)) {
    auto in_unit = [](double b) { return b >= 0 && b < 1; };
    if (!in_unit(options_.beta1) || !in_unit(options_.beta2))
      throw Error("Adam", "beta1 " + std::to_string(options_.beta1) + " and beta2 " +
                              std::to_string(options_.beta2) + " must lie in [0, 1)");
    if (!(options_.epsilon >= 0))
      throw Error("Adam", "epsilon " + std::to_string(options_.epsilon) + " is negative");
  }

  template <class... P, class... G>
  void step(std::tuple<P&...> params, std::tuple<G&...> grads,
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer step");
    const std::int64_t t_next = driver_.steps() + 1;
    const double lr = options_.learning_rate(t_next);
    detail::check_rate("Adam", lr, t_next);
    const double b1 = options_.beta1;
    const double b2 = options_.beta2;
    const detail::AdamScalars a{.lr = lr,
                                .b1 = b1,
                                .b2 = b2,
                                .eps = options_.epsilon,
                                .wd = options_.weight_decay,
                                .c1 = 1 - std::pow(b1, static_cast<double>(t_next)),
                                .c2 = 1 - std::pow(b2, static_cast<double>(t_next)),
                                .decoupled = options_.decoupled_weight_decay};
    driver_.run<detail::AdamState>(
        "Adam", params, grads, [this](const auto& p) { return this->make_state(p); },
        [&](const auto& p, const auto& g, auto& state, std::int64_t) {
          detail::adam_update(p.local_view(), g.local_view(), state.m->local_view(),
                              state.v->local_view(), a);
        });
  }

  [[nodiscard]] std::int64_t steps() const noexcept { return driver_.steps(); }
  [[nodiscard]] const AdamOptions& options() const noexcept { return options_; }

  /// Adds the state to a checkpoint: tensors "<prefix><i>.<slot>", metadata "<prefix>steps".
  template <class... P>
  void save(io::SafetensorsWriter& w, std::tuple<P&...> params,
            const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer save");
    detail::save_state<detail::AdamState>("Adam", driver_, w, params, prefix);
  }
  /// Restores what save() wrote, onto `params`' mesh and layouts (any mesh may have saved it).
  template <class... P>
  void load(const io::SafetensorsReader& r, std::tuple<P&...> params,
            const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer load");
    detail::load_state<detail::AdamState>("Adam", driver_, r, params, prefix,
                                          [this](const auto& p) { return this->make_state(p); });
  }

 private:
  template <class S>
  detail::AdamState<S> make_state(const S& p) const {
    detail::AdamState<S> s;
    s.m.emplace(p.mesh(), p.shape());
    s.v.emplace(p.mesh(), p.shape());
    return s;
  }
  AdamOptions options_;
  detail::Driver driver_;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter; PyTorch's AdamW).
class AdamW : public Adam {
 public:
  explicit AdamW(AdamWOptions o = {})
      : Adam(AdamOptions{std::move(o.learning_rate), o.beta1, o.beta2, o.epsilon, o.weight_decay,
                         o.decoupled_weight_decay}) {}
};

/// Adafactor (Shazeer & Stern 2018, as in Mesh-TensorFlow / T5 and HF transformers), at step t:
///   beta2_t = 1 - t^(-decay_rate); for a parameter of rank >= 2 (when factored), over its last
///   two labels R, C: row = beta2_t row + (1 - beta2_t) mean_C(g^2 + eps1), col likewise over R,
///   v_hat = row (x) col / mean_R(row); otherwise v = beta2_t v + (1 - beta2_t)(g^2 + eps1).
///   u = g / sqrt(v_hat); u /= max(1, RMS(u) / d); lr_t = (learning_rate(t), or
///   min(1e-2, 1/sqrt(t)) when none) * max(eps2, RMS(p)) (the factor when
///   multiply_by_parameter_scale); step = lr_t u, or with beta1 m = beta1 m + (1-beta1) lr_t u;
///   p -= wd lr_t p + step.
/// Means and RMS values are over global values (AllReduces over the axes of the reduced label;
/// the RMS values over all the parameter's axes).
class Adafactor {
 public:
  explicit Adafactor(AdafactorOptions options = {}) : options_(std::move(options)) {
    if (!(options_.beta1 >= 0 && options_.beta1 < 1))
      throw Error("Adafactor", "beta1 " + std::to_string(options_.beta1) + " must lie in [0, 1)");
    if (!(options_.decay_rate > 0))
      throw Error("Adafactor",
                  "decay_rate " + std::to_string(options_.decay_rate) + " must be positive");
    if (!(options_.clipping_threshold > 0))
      throw Error("Adafactor", "clipping_threshold " + std::to_string(options_.clipping_threshold) +
                                   " must be positive");
  }

  template <class... P, class... G>
  void step(std::tuple<P&...> params, std::tuple<G&...> grads,
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer step");
    const std::int64_t t_next = driver_.steps() + 1;
    const double t = static_cast<double>(t_next);
    const double base_lr = options_.learning_rate ? (*options_.learning_rate)(t_next)
                                                  : std::min(1e-2, 1 / std::sqrt(t));
    detail::check_rate("Adafactor", base_lr, t_next);
    const double beta2t = 1 - std::pow(t, -options_.decay_rate);
    driver_.run<detail::AdafactorState>(
        "Adafactor", params, grads, [this](const auto& p) { return this->make_state(p); },
        [&](const auto& p, const auto& g, auto& state, std::int64_t) {
          update_one(p, g, state, base_lr, beta2t);
        });
  }

  [[nodiscard]] std::int64_t steps() const noexcept { return driver_.steps(); }
  [[nodiscard]] const AdafactorOptions& options() const noexcept { return options_; }

  /// Adds the state to a checkpoint: tensors "<prefix><i>.<slot>", metadata "<prefix>steps".
  template <class... P>
  void save(io::SafetensorsWriter& w, std::tuple<P&...> params,
            const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer save");
    detail::save_state<detail::AdafactorState>("Adafactor", driver_, w, params, prefix);
  }
  /// Restores what save() wrote, onto `params`' mesh and layouts (any mesh may have saved it).
  template <class... P>
  void load(const io::SafetensorsReader& r, std::tuple<P&...> params,
            const std::string& prefix = "optimizer.",
            std::source_location where = std::source_location::current()) {
    const gshard::detail::UserSite site(where, "optimizer load");
    detail::load_state<detail::AdafactorState>(
        "Adafactor", driver_, r, params, prefix,
        [this](const auto& p) { return this->make_state(p); });
  }

 private:
  template <class S>
  detail::AdafactorState<S> make_state(const S& p) const {
    detail::AdafactorState<S> s;
    if (options_.beta1 > 0) s.m.emplace(p.mesh(), p.shape());
    if constexpr (S::rank >= 2) {
      if (options_.factored) {
        Shape row = p.shape();
        row.pop_back();
        Shape col = p.shape();
        col.erase(col.end() - 2);
        s.row.emplace(p.mesh(), row);
        s.col.emplace(p.mesh(), col);
        return s;
      }
    }
    s.v.emplace(p.mesh(), p.shape());
    return s;
  }

  template <class S>
  void update_one(const S& p, const S& g, detail::AdafactorState<S>& state, double base_lr,
                  double beta2t) const {
    using T = typename S::value_type;
    using detail::View;
    const auto& mesh = p.mesh();
    const auto pb =
        gshard::detail::block_index(S::layout, p.shape(), mesh.sizes(), mesh.coordinates());
    const View<T>& pv = p.local_view();
    const View<T>& gv = g.local_view();
    const std::int64_t n = detail::extent(pv);
    const double eps1 = options_.epsilon1;
    const double b2 = beta2t;

    detail::AdafactorPreconditioned<T> u;
    u.g = gv;
    u.factored = state.row.has_value();
    if constexpr (S::rank >= 2) {
      if (u.factored) {
        const Shape local = p.local_shape();
        const std::int64_t R = local[local.size() - 2];
        const std::int64_t C = local[local.size() - 1];
        const std::int64_t global_r = p.shape()[p.shape().size() - 2];
        const std::int64_t global_c = p.shape()[p.shape().size() - 1];
        const std::int64_t O = R * C == 0 ? 0 : n / (R * C);
        const Shape valid = p.valid_extents();
        const std::int64_t valid_r = valid[valid.size() - 2];
        const std::int64_t valid_c = valid[valid.size() - 1];
        using Row = typename detail::FactoredTypes<S>::Row;
        using Col = typename detail::FactoredTypes<S>::Col;
        const auto rb = gshard::detail::block_index(Row::layout, state.row->shape(), mesh.sizes(),
                                                    mesh.coordinates());
        const auto cb = gshard::detail::block_index(Col::layout, state.col->shape(), mesh.sizes(),
                                                    mesh.coordinates());
        const View<T>& rowv = state.row->local_view();
        const View<T>& colv = state.col->local_view();
        const unsigned r_axes = detail::dim_mask(S::layout, S::rank - 2);
        const unsigned c_axes = detail::dim_mask(S::layout, S::rank - 1);
        // Local sums of g^2 over this rank's valid columns (per row) and rows (per column).
        View<double> row_sum("gshard::nn::Adafactor row sums", O * R);
        View<double> col_sum("gshard::nn::Adafactor column sums", O * C);
        detail::adafactor_row_sums(gv, rb, C, valid_c, row_sum);
        detail::adafactor_column_sums(gv, cb, R, C, valid_r, col_sum);
        detail::sum_view_over_axes(mesh, c_axes, row_sum);
        detail::sum_view_over_axes(mesh, r_axes, col_sum);
        const double inv_c = 1.0 / static_cast<double>(global_c);
        const double inv_r = 1.0 / static_cast<double>(global_r);
        detail::adafactor_statistics("gshard::nn::Adafactor row statistics", O * R, rowv, rb,
                                     row_sum, inv_c, b2, eps1);
        detail::adafactor_statistics("gshard::nn::Adafactor column statistics", O * C, colv, cb,
                                     col_sum, inv_r, b2, eps1);
        // Mean of the row statistics over R (global), per leading index.
        View<double> row_mean("gshard::nn::Adafactor row means", O);
        detail::adafactor_row_mean_sums(rowv, rb, R, valid_r, row_mean);
        detail::sum_view_over_axes(mesh, r_axes, row_mean);
        detail::adafactor_scale_means(row_mean, inv_r);
        u.rows = rowv;
        u.cols = colv;
        u.means = row_mean;
        u.RC = R * C;
        u.C = C;
      }
    }
    if (!u.factored) {
      u.second = state.v->local_view();
      detail::adafactor_second_moment(n, u.second, gv, pb, b2, eps1);
    }

    // RMS of u and of the parameter (before the update), global: one AllReduce of 2 doubles.
    double sums[2] = {0, 0};
    sums[0] = detail::adafactor_local_sum_u2(u, pb, n);
    const bool scale = options_.multiply_by_parameter_scale;
    if (scale) sums[1] = detail::local_sum_of_squares(pv);
    detail::sum_over_axes(mesh, detail::split_mask(S::layout), sums, scale ? 2 : 1);
    const double count = static_cast<double>(std::max<std::int64_t>(1, p.size()));
    const double rms_u = std::sqrt(sums[0] / count);
    const double rms_p = std::sqrt(sums[1] / count);
    const double lr = base_lr * (scale ? std::max(options_.epsilon2, rms_p) : 1.0);
    const double step_scale = lr / std::max(1.0, rms_u / options_.clipping_threshold);
    const bool first_moment = state.m.has_value();
    const View<T>& mv = first_moment ? state.m->local_view() : pv;
    detail::adafactor_update(pv, mv, u, pb, step_scale, first_moment, options_.beta1,
                             options_.weight_decay, lr);
  }

  AdafactorOptions options_;
  detail::Driver driver_;
};

}  // namespace gshard::nn
