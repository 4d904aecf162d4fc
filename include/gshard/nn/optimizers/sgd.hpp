#pragma once
// Stochastic gradient descent (PyTorch semantics), part of nn/optimizers.hpp.
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

#include "driver.hpp"

namespace gshard::nn {

struct SgdOptions {
  LearningRate learning_rate = 0.01;
  double momentum = 0;
  bool nesterov = false;
  double weight_decay = 0;  // L2: wd * p added to the gradient
};

namespace detail {

// Device kernels: templated on element types only (nvcc's rules, optimizers/driver.hpp).

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

template <class P>
struct SgdState {
  std::optional<P> momentum;
  template <class F>
  void each(F&& f) {
    f("momentum", momentum);
  }
};

}  // namespace detail

/// Stochastic gradient descent as PyTorch's SGD (dampening 0): g' = g + wd * p; with momentum,
/// buf = g' at step 1, then mu * buf + g'; the step uses buf, or g' + mu * buf (Nesterov).
/// p -= lr(t) * step. No communication.
class Sgd : public detail::OptimizerBase<Sgd, detail::SgdState> {
 public:
  static constexpr const char* name = "Sgd";

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

  [[nodiscard]] const SgdOptions& options() const noexcept { return options_; }

 private:
  friend class detail::OptimizerBase<Sgd, detail::SgdState>;
  template <class S>
  detail::SgdState<S> make_state(const S& p) const {
    detail::SgdState<S> s;
    if (options_.momentum != 0) s.momentum.emplace(p.mesh(), p.shape());
    return s;
  }
  SgdOptions options_;
};
}  // namespace gshard::nn
