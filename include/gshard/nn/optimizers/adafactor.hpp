#pragma once
// Adafactor (Shazeer & Stern 2018), part of nn/optimizers.hpp: factored second moments, global
// means and RMS values over the parameter's mesh axes.
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

#include "../../comm/collectives.hpp"
#include "../../kernels/math.hpp"
#include "../../spmd/reshard.hpp"
#include "../../tensor/local_index.hpp"
#include "../mesh_sums.hpp"
#include "driver.hpp"

namespace gshard::nn {

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

// In-place sum of a View of doubles over the axes in `mask` (through a host buffer MPI can use).
template <class MeshT>
void sum_view_over_axes(const MeshT& mesh, unsigned mask, const View<double>& v) {
  if (group_size_of(mask, mesh.sizes()) == 1 || v.extent(0) == 0) return;
  gshard::detail::MpiAccess<double> h(v, true);
  sum_over_axes(mesh, mask, h.data(), extent(v));
  h.copy_out();
}

// Device kernels: templated on element types only (nvcc's rules, optimizers/driver.hpp).

using gshard::detail::BlockIndex;

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
class Adafactor : public detail::OptimizerBase<Adafactor, detail::AdafactorState> {
 public:
  static constexpr const char* name = "Adafactor";

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

  [[nodiscard]] const AdafactorOptions& options() const noexcept { return options_; }

 private:
  friend class detail::OptimizerBase<Adafactor, detail::AdafactorState>;
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
};

}  // namespace gshard::nn
