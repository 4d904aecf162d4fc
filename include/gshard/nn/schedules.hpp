#pragma once
// Learning-rate schedules: functions of the optimizer step, counted from 1 (the first update).
//
//   constant(lr)                          lr
//   linear_warmup(peak, w)                peak * t / w while t < w, then peak
//   inverse_sqrt(peak, w)                 peak * t / w while t < w, then peak * sqrt(w / t)
//   cosine(peak, w, total, final = 0)     peak * t / w while t < w, then
//                                         peak * (f + (1 - f) * (1 + cos(pi * p)) / 2) with
//                                         p = min(1, (t - w) / (total - w))
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>

#include "../core/error.hpp"

namespace gshard::nn {

/// A learning rate as a function of the step (1 for the first update).
using Schedule = std::function<double(std::int64_t step)>;

/// A constant rate or a schedule; optimizers take either.
class LearningRate {
 public:
  LearningRate(double value)  // NOLINT: implicit on purpose (`.learning_rate = 1e-3`)
      : schedule_([value](std::int64_t) { return value; }) {}
  LearningRate(Schedule schedule)  // NOLINT: implicit on purpose
      : schedule_(std::move(schedule)) {
    if (!schedule_) throw Error("LearningRate", "the schedule is empty");
  }
  /// Any callable double(int64), e.g. a lambda.
  template <class F>
  requires(std::is_invocable_r_v<double, F&, std::int64_t> && !std::is_convertible_v<F, double> &&
           !std::is_same_v<std::decay_t<F>, Schedule> &&
           !std::is_same_v<std::decay_t<F>, LearningRate>)
      LearningRate(F f)  // NOLINT: implicit on purpose
      : schedule_(std::move(f)) {}

  [[nodiscard]] double operator()(std::int64_t step) const { return schedule_(step); }

 private:
  Schedule schedule_;
};

namespace detail {

inline void check_schedule(const char* op, double peak, std::int64_t warmup) {
  if (!std::isfinite(peak))
    throw Error(op, "the peak learning rate " + std::to_string(peak) + " is not finite");
  if (warmup < 0)
    throw Error(op, "warmup_steps is " + std::to_string(warmup) + "; it must be at least 0");
}

// Linear warm-up: peak * t / w for t < w (t counts from 1, so the first step is not 0).
inline double warmup_value(double peak, std::int64_t warmup, std::int64_t step) {
  return peak * static_cast<double>(step) / static_cast<double>(warmup);
}

}  // namespace detail

/// The same rate at every step.
inline Schedule constant(double lr) {
  detail::check_schedule("constant", lr, 0);
  return [lr](std::int64_t) { return lr; };
}

/// Linear warm-up from peak / w at step 1 to peak at step w, then constant.
inline Schedule linear_warmup(double peak, std::int64_t warmup_steps) {
  detail::check_schedule("linear_warmup", peak, warmup_steps);
  return [peak, warmup_steps](std::int64_t step) {
    return step < warmup_steps ? detail::warmup_value(peak, warmup_steps, step) : peak;
  };
}

/// The Transformer's (and GShard's) rate: linear warm-up to peak at step w, then
/// peak * sqrt(w / t). Needs w >= 1.
inline Schedule inverse_sqrt(double peak, std::int64_t warmup_steps) {
  detail::check_schedule("inverse_sqrt", peak, warmup_steps);
  if (warmup_steps < 1)
    throw Error("inverse_sqrt", "warmup_steps is " + std::to_string(warmup_steps) +
                                    "; it must be at least 1 (the decay is peak * sqrt(w / t))");
  return [peak, warmup_steps](std::int64_t step) {
    if (step < warmup_steps) return detail::warmup_value(peak, warmup_steps, step);
    return peak * std::sqrt(static_cast<double>(warmup_steps) / static_cast<double>(step));
  };
}

/// Linear warm-up to peak at step w, then a half cosine down to final_fraction * peak at
/// total_steps, constant after. Needs total_steps > warmup_steps.
inline Schedule cosine(double peak, std::int64_t warmup_steps, std::int64_t total_steps,
                       double final_fraction = 0) {
  detail::check_schedule("cosine", peak, warmup_steps);
  if (total_steps <= warmup_steps)
    throw Error("cosine", "total_steps " + std::to_string(total_steps) +
                              " must exceed warmup_steps " + std::to_string(warmup_steps));
  if (!(final_fraction >= 0 && final_fraction <= 1))
    throw Error("cosine", "final_fraction " + std::to_string(final_fraction) + " is not in [0, 1]");
  return [=](std::int64_t step) {
    if (step < warmup_steps) return detail::warmup_value(peak, warmup_steps, step);
    const double progress = std::min(1.0, static_cast<double>(step - warmup_steps) /
                                              static_cast<double>(total_steps - warmup_steps));
    constexpr double pi = 3.14159265358979323846;
    return peak * (final_fraction + (1 - final_fraction) * 0.5 * (1 + std::cos(pi * progress)));
  };
}

}  // namespace gshard::nn
