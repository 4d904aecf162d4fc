#pragma once
// Adam and AdamW (PyTorch semantics), part of nn/optimizers.hpp.
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

#include "../../kernels/math.hpp"
#include "driver.hpp"

namespace gshard::nn {

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

namespace detail {

// Device kernels: templated on element types only (nvcc's rules, optimizers/driver.hpp).

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

// Adafactor's local sums of g^2 over the valid columns of each (leading index, row) pair.

template <class P>
struct AdamState {
  std::optional<P> m, v;
  template <class F>
  void each(F&& f) {
    f("m", m);
    f("v", v);
  }
};

}  // namespace detail

/// Adam (Kingma & Ba) with PyTorch's semantics: m = b1 m + (1-b1) g', v = b2 v + (1-b2) g'^2,
/// p -= lr(t) * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps); g' = g + wd * p, or with decoupled
/// weight decay (AdamW) g' = g and p *= 1 - lr(t) * wd first. No communication.
class Adam : public detail::OptimizerBase<Adam, detail::AdamState> {
 public:
  static constexpr const char* name = "Adam";

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

  [[nodiscard]] const AdamOptions& options() const noexcept { return options_; }

 private:
  friend class detail::OptimizerBase<Adam, detail::AdamState>;
  template <class S>
  detail::AdamState<S> make_state(const S& p) const {
    detail::AdamState<S> s;
    s.m.emplace(p.mesh(), p.shape());
    s.v.emplace(p.mesh(), p.shape());
    return s;
  }
  AdamOptions options_;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter; PyTorch's AdamW).
class AdamW : public Adam {
 public:
  explicit AdamW(AdamWOptions o = {})
      : Adam(AdamOptions{std::move(o.learning_rate), o.beta1, o.beta2, o.epsilon, o.weight_decay,
                         o.decoupled_weight_decay}) {}
};
}  // namespace gshard::nn
