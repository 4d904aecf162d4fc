#pragma once
// Normalizations over one label: softmax<"S">(x), log_softmax, layer_norm<"M">(x[, gain[, bias]],
// eps), rms_norm<"M">(x[, gain], eps). The result has the input's layout without pending
// partials (a pending input is finished first). Over a split label each row's statistics are
// local sums over the valid elements followed by AllReduces of the row block (the reduced size):
// softmax and log_softmax two (max, then the sum of exp(x - max)); layer_norm two (the sum, then
// the sum of squared deviations from the mean: two passes, stable where E[x^2] - E[x]^2 is not);
// rms_norm one (the sum of squares). Gain and bias are tensors over the label alone, broadcast by
// label and read in the input's split of it (resharded to it when they differ).
//
// Gradients: layer_norm and rms_norm keep each row's shift (mean; 0 for rms_norm) and scale
// (1/sqrt(var + eps)) from the forward pass; with xhat = (x - shift) scale and gh = g gain,
// dx = scale (gh - mean(gh) - xhat mean(gh xhat)) (rms_norm: without mean(gh)), whose two row
// sums over a split label take ONE AllReduce (both sums in one buffer); dgain = sum of g xhat and
// dbias = sum of g over the other labels (partial sums over their axes, finished by the driver).
// All are linear in g, so a cotangent still partial over unsplit axes stays partial.
#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <limits>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "../expr/node.hpp"
#include "../kernels/math.hpp"
#include "../kernels/rows.hpp"
#include "reduce.hpp"

namespace gshard {

namespace normalize_error {
template <class>
inline constexpr bool always_false = false;
template <auto Op, auto Label, auto InputSpec>
struct label_not_in_input {
  static_assert(always_false<label_not_in_input>,
                "gshard normalization: the label is not a label of the input (op, label, input "
                "spec: the arguments above)");
};
template <auto Op, auto Labels>
struct give_exactly_one_label {
  static_assert(always_false<give_exactly_one_label>,
                "gshard normalization: normalize over exactly one label, e.g. softmax<\"S\">(x)");
};
template <auto Op, auto InputSpec>
struct needs_floating_point {
  static_assert(always_false<needs_floating_point>,
                "gshard normalization: needs float or double elements");
};
template <auto Op, auto Label, auto ParameterSpec>
struct gain_or_bias_labels_differ_from_the_label {
  static_assert(always_false<gain_or_bias_labels_differ_from_the_label>,
                "gshard normalization: a gain or bias must have exactly one label, the normalized "
                "one (op, label, its spec: the arguments above)");
};
}  // namespace normalize_error

namespace detail {

enum class Normalization { softmax, log_softmax, layer_norm, rms_norm };

inline const char* normalization_name(Normalization k) {
  switch (k) {
    case Normalization::softmax:
      return "softmax";
    case Normalization::log_softmax:
      return "log_softmax";
    case Normalization::layer_norm:
      return "layer_norm";
    case Normalization::rms_norm:
      return "rms_norm";
  }
  return "?";
}

/// The layout a gain or bias is read in: the input's dimension of the label, with its axes.
constexpr Layout parameter_layout(const Layout& in, char label) {
  Layout l{};
  const int d = in.find(label);
  if (d < 0) return l;
  l.rank = 1;
  l.dims[0] = in.dims[d];
  return l;
}

/// Brings a gain or bias to `need` (finishing its partials, gathering or slicing its split).
template <class T>
Kokkos::View<T*> parameter_block(const std::string& op, const char* what, const RuntimeTensor<T>& p,
                                 const Layout& need, std::int64_t size, const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  if (p.layout.rank != 1 || p.layout.dims[0].label != need.dims[0].label || p.shape[0] != size)
    throw Error(op, std::string("the ") + what + " must have the one label '" + need.dims[0].label +
                        "' of size " + std::to_string(size) + "; it is the " +
                        describe_input(p.layout, p.shape, axis_names, what));
  return reshard_runtime(p, need, mesh, axis_names).data;
}

/// What the backward of layer_norm / rms_norm reads from the forward: per-row statistics (one
/// per row of the padded kept block, in reduce_shape's row order; y = (x - shift) * scale before
/// gain and bias), the finished input's block and the gain's block in the input's split of the
/// label (empty: no gain).
template <class T>
struct NormStats {
  Kokkos::View<T*> shift;
  Kokkos::View<T*> scale;
  Kokkos::View<T*> input;
  Kokkos::View<T*> gain;
  bool has_gain = false;
};

/// The whole sharded normalization on run-time layouts (the typed API and the property tests
/// both run this). `gain` and `bias` may be null. Collective over the mesh. `stats` (optional,
/// layer_norm and rms_norm) receives each row's shift and scale for the backward pass.
/// The row kernel of normalize_runtime (kernels/rows.hpp): a row's statistics folded into one
/// scale and one shift, then every element of the row over the label's padded extent written
/// once (padding with 0).
template <class T>
struct NormalizeRows {
  Normalization kind;
  ReduceShape rs;
  std::int64_t label_valid, label_stride, label_ext;
  T count, eps;
  Kokkos::View<T*> s1, s2, xv, y, g, b;
  bool has_gain, has_bias, keep;
  Kokkos::View<T*> kept_shift, kept_scale;
  struct State {
    std::int64_t row, base, valid;
    T shift, scale;
  };
  KOKKOS_INLINE_FUNCTION State begin(const std::int64_t row) const {
    bool pad = false;
    State s{row, rs.row_base(row, pad), 0, T{}, static_cast<T>(1)};
    s.valid = pad ? 0 : label_valid;
    switch (kind) {
      case Normalization::softmax:
      case Normalization::log_softmax:
        s.shift = s1(row) == ReduceKind<LocalReduce::max, T>::lowest() ? T{} : s1(row);
        if (kind == Normalization::softmax)
          s.scale = static_cast<T>(1) / s2(row);
        else
          s.shift += math::log(s2(row));
        break;
      case Normalization::layer_norm:
        s.shift = s1(row);
        s.scale = static_cast<T>(1) / math::sqrt(s2(row) / count + eps);
        break;
      case Normalization::rms_norm:
        s.scale = static_cast<T>(1) / math::sqrt(s1(row) / count + eps);
        break;
    }
    return s;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State&) const { return label_ext; }
  KOKKOS_INLINE_FUNCTION void element(const State& s, const std::int64_t l) const {
    if (keep && l == 0) {  // one writer per row
      kept_shift(s.row) = s.shift;
      kept_scale(s.row) = s.scale;
    }
    const std::int64_t at = s.base + l * label_stride;
    if (l >= s.valid) {
      y(at) = T{};
      return;
    }
    T r = kind == Normalization::softmax ? math::exp(xv(at) - s.shift) * s.scale
                                         : (xv(at) - s.shift) * s.scale;
    if (has_gain) r *= g(l);
    if (has_bias) r += b(l);
    y(at) = r;
  }
};

template <class T>
RuntimeTensor<T> normalize_runtime(Normalization kind, char label, const MeshState& mesh,
                                   const std::vector<std::string>& axis_names,
                                   const RuntimeTensor<T>& in, double eps,
                                   const RuntimeTensor<T>* gain, const RuntimeTensor<T>* bias,
                                   NormStats<T>* stats = nullptr) {
  static_assert(std::is_floating_point_v<T>, "gshard normalization: float or double elements");
  const std::string op = normalization_name(kind);
  const std::string labels(1, label);
  check_reduce_input(op, labels, in.layout, in.shape, false, axis_names);
  const RuntimeTensor<T> x = finish_pending(in, mesh, axis_names);
  const int ld = x.layout.find(label);
  const std::int64_t n = x.shape[static_cast<std::size_t>(ld)];
  const Layout need = parameter_layout(x.layout, label);
  Kokkos::View<T*> g, b;
  if (gain != nullptr) g = parameter_block(op, "gain", *gain, need, n, mesh, axis_names);
  if (bias != nullptr) b = parameter_block(op, "bias", *bias, need, n, mesh, axis_names);
  const bool has_gain = gain != nullptr;
  const bool has_bias = bias != nullptr;

  const ReduceShape rs = reduce_shape(x.layout, x.shape, mesh, labels);
  const unsigned mask = reduced_axes(x.layout, labels);
  auto fresh = [](const char* name, std::int64_t size) {
    return Kokkos::View<T*>(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing),
                            size);
  };
  const Kokkos::View<T*> s1 = fresh("gshard::normalize stat", rs.out_size);
  const Kokkos::View<T*> s2 = fresh("gshard::normalize stat", rs.out_size);
  const Kokkos::View<T*> none;
  const Kokkos::View<std::int64_t*> no_index;
  const T count = static_cast<T>(n);
  switch (kind) {
    case Normalization::softmax:
    case Normalization::log_softmax:
      local_reduce<T>(LocalReduce::max, rs, x.data, s1, none, no_index);
      all_reduce_axes(s1, ReduceOp::max, mesh, mask, axis_names);
      local_reduce<T>(LocalReduce::sumexp, rs, x.data, s2, s1, no_index);
      all_reduce_axes(s2, ReduceOp::sum, mesh, mask, axis_names);
      break;
    case Normalization::layer_norm:
      local_reduce<T>(LocalReduce::sum, rs, x.data, s1, none, no_index);
      all_reduce_axes(s1, ReduceOp::sum, mesh, mask, axis_names);
      Kokkos::parallel_for(
          "gshard::layer_norm mean", Kokkos::RangePolicy<>(0, rs.out_size),
          KOKKOS_LAMBDA(const std::int64_t i) { s1(i) /= count; });
      local_reduce<T>(LocalReduce::sumsqdev, rs, x.data, s2, s1, no_index);
      all_reduce_axes(s2, ReduceOp::sum, mesh, mask, axis_names);
      break;
    case Normalization::rms_norm:
      local_reduce<T>(LocalReduce::sumsq, rs, x.data, s1, none, no_index);
      all_reduce_axes(s1, ReduceOp::sum, mesh, mask, axis_names);
      break;
  }
  // One pass per row over the label's padded extent: every element of the block is written once
  // (padding with 0), with the row's statistics folded into one scale and one shift.
  const std::int64_t label_ext =
      local_extents(x.layout, x.shape, mesh.sizes)[static_cast<std::size_t>(ld)];
  const std::int64_t label_valid = rs.red_valid[0];
  const std::int64_t label_stride = rs.red_stride[0];
  RuntimeTensor<T> out{x.layout, x.shape,
                       fresh("gshard::normalize", static_cast<std::int64_t>(x.data.extent(0))),
                       ReduceOp::sum};
  const Kokkos::View<T*> y = out.data;
  const Kokkos::View<T*> xv = x.data;
  const bool keep = stats != nullptr;
  Kokkos::View<T*> kept_shift, kept_scale;
  if (keep) {
    kept_shift = fresh("gshard::normalize shift", rs.out_size);
    kept_scale = fresh("gshard::normalize scale", rs.out_size);
    stats->shift = kept_shift;
    stats->scale = kept_scale;
    stats->input = x.data;
    stats->gain = g;
    stats->has_gain = has_gain;
  }
  for_each_row(
      "gshard::normalize", rs.out_size,
      NormalizeRows<T>{kind, rs, label_valid, label_stride, label_ext, count, static_cast<T>(eps),
                       s1, s2, xv, y, g, b, has_gain, has_bias, keep, kept_shift, kept_scale});
  return out;
}

/// The gradient of softmax (dx = y (g - sum(g y))) and log_softmax (dx = g - exp(y) sum(g)) over
/// the label, from the result y: the sum over a split label is a partial sum that the broadcast
/// back finishes (one AllReduce of the reduced size).
template <class T>
RuntimeTensor<T> softmax_cotangent(bool log, char label, const RuntimeTensor<T>& y,
                                   const RuntimeTensor<T>& g, const MeshState& mesh,
                                   const std::vector<std::string>& axis_names) {
  const Kokkos::View<T*> gv = g.data;
  const Kokkos::View<T*> yv = y.data;
  const std::size_t n = gv.extent(0);
  Kokkos::View<T*> prod(
      Kokkos::view_alloc(std::string("gshard::softmax_grad"), Kokkos::WithoutInitializing), n);
  Kokkos::parallel_for(
      "gshard::softmax_grad", Kokkos::RangePolicy<>(0, n),
      KOKKOS_LAMBDA(std::size_t i) { prod(i) = log ? gv(i) : gv(i) * yv(i); });
  std::string all, kept;
  for (int d = 0; d < y.layout.rank; ++d) {
    all += y.layout.dims[d].label;
    if (y.layout.dims[d].label != label) kept += y.layout.dims[d].label;
  }
  const std::string text = all + "->" + kept;
  const RuntimeTensor<T> summed =
      einsum_runtime<T>(text, parse_einsum(text).spec, mesh, axis_names,
                        RuntimeTensor<T>(g.layout, g.shape, prod), nullptr);
  const Kokkos::View<T*> sv =
      broadcast_runtime(summed, finished_layout(y.layout), y.shape, mesh, axis_names).data;
  // 1 on real elements, 0 on padding (exp(y) is not zero there).
  RuntimeTensor<T> one(Layout{}, Shape{}, Kokkos::View<T*>("gshard::one", 1));
  Kokkos::deep_copy(one.data, T(1));
  const Kokkos::View<T*> real =
      broadcast_runtime(one, finished_layout(y.layout), y.shape, mesh, axis_names).data;
  Kokkos::View<T*> out(
      Kokkos::view_alloc(std::string("gshard::softmax_grad"), Kokkos::WithoutInitializing), n);
  Kokkos::parallel_for(
      "gshard::softmax_grad", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::size_t i) {
        out(i) = log ? gv(i) - real(i) * math::exp(yv(i)) * sv(i) : yv(i) * (gv(i) - sv(i));
      });
  return RuntimeTensor<T>(g.layout, g.shape, out, ReduceOp::sum);
}

/// The row kernels of layer_norm_cotangents (kernels/rows.hpp). As a reduction: per row the
/// sums of gh and gh xhat (gh = g * gain), writing g xhat for dgain on the way; as a row loop:
/// dx = scale (gh - mean(gh) - xhat mean(gh xhat)) once the sums are complete.
template <class T>
struct LayerNormGradRows {
  ReduceShape rs;
  std::int64_t label_valid, label_stride, rows;
  T count;
  bool rms, has_gain, need_gx;
  Kokkos::View<T*> gv, xv, shift, scale, gain, gx, sums, dx;
  struct Reduce {
    struct Acc {
      T gh, ghx;
    };
    KOKKOS_INLINE_FUNCTION static Acc identity() { return {T{}, T{}}; }
    KOKKOS_INLINE_FUNCTION static void combine(Acc& d, const Acc& s) {
      d.gh += s.gh;
      d.ghx += s.ghx;
    }
  };
  using Acc = typename Reduce::Acc;
  struct State {
    std::int64_t row, base;
    bool pad;
  };
  KOKKOS_INLINE_FUNCTION State begin(const std::int64_t row) const {
    State s{row, 0, false};
    s.base = rs.row_base(row, s.pad);
    return s;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State& s) const {
    return s.pad ? 0 : label_valid;
  }
  KOKKOS_INLINE_FUNCTION T xhat(const State& s, const std::int64_t at) const {
    return (xv(at) - shift(s.row)) * scale(s.row);
  }
  KOKKOS_INLINE_FUNCTION T gh(const std::int64_t at, const std::int64_t l) const {
    return has_gain ? gv(at) * gain(l) : gv(at);
  }
  KOKKOS_INLINE_FUNCTION Acc term(const State& s, const std::int64_t l) const {
    const std::int64_t at = s.base + l * label_stride;
    const T xh = xhat(s, at);
    const T h = gh(at, l);
    if (need_gx) gx(at) = gv(at) * xh;
    return {h, h * xh};
  }
  KOKKOS_INLINE_FUNCTION void finish(const std::int64_t row, const State&, const Acc& acc) const {
    sums(row) = acc.gh;
    sums(rows + row) = acc.ghx;
  }
  KOKKOS_INLINE_FUNCTION void element(const State& s, const std::int64_t l) const {
    const T mean_gh = rms ? T{} : sums(s.row) / count;
    const T mean_ghx = sums(rows + s.row) / count;
    const std::int64_t at = s.base + l * label_stride;
    dx(at) = scale(s.row) * (gh(at, l) - mean_gh - xhat(s, at) * mean_ghx);
  }
};

/// The gradients of layer_norm / rms_norm (see the top of the file) from the result's cotangent
/// g: {dx, dgain, dbias}, each only where `want` asks (that input is tracked). `x`: the finished
/// input's layout and shape (the values are in `stats`).
template <class T>
Cotangents layer_norm_cotangents(bool rms, char label, const RuntimeTensor<T>& x,
                                 const NormStats<T>& stats, std::array<bool, 3> want,
                                 const RuntimeTensor<T>& g, const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  const std::string labels(1, label);
  const ReduceShape rs = reduce_shape(x.layout, x.shape, mesh, labels);
  const unsigned mask = reduced_axes(x.layout, labels);
  const int ld = x.layout.find(label);
  const std::int64_t label_valid = rs.red_valid[0];
  const std::int64_t label_stride = rs.red_stride[0];
  const T count = static_cast<T>(x.shape[static_cast<std::size_t>(ld)]);
  const std::int64_t rows = rs.out_size;
  const std::size_t n = g.data.extent(0);
  const Kokkos::View<T*> gain = stats.gain;
  const bool has_gain = stats.has_gain;
  const Kokkos::View<T*> gv = g.data;
  const Kokkos::View<T*> xv = stats.input;
  const Kokkos::View<T*> shift = stats.shift;
  const Kokkos::View<T*> scale = stats.scale;
  // Row sums of gh and gh xhat, one buffer: one AllReduce over the label's axes.
  Kokkos::View<T*> sums("gshard::layer_norm_grad sums", static_cast<std::size_t>(2 * rows));
  // g xhat for dgain; zero-filled so that padding stays zero.
  Kokkos::View<T*> gx("gshard::layer_norm_grad g xhat", want[1] ? n : 0);
  Kokkos::View<T*> dx("gshard::layer_norm_grad", want[0] ? n : 0);
  const bool need_gx = want[1];
  const LayerNormGradRows<T> k{rs, label_valid, label_stride, rows,  count, rms, has_gain, need_gx,
                               gv, xv,          shift,        scale, gain,  gx,  sums,     dx};
  reduce_rows("gshard::layer_norm_grad sums", rows, k);
  Cotangents out(3);
  if (want[0]) {
    all_reduce_axes(sums, ReduceOp::sum, mesh, mask, axis_names);
    for_each_row("gshard::layer_norm_grad", rows, k);
    out[0] = AnyTensor(RuntimeTensor<T>(g.layout, g.shape, dx, ReduceOp::sum));
  }
  const Layout pl = parameter_layout(x.layout, label);
  constexpr bool dbl = std::is_same_v<T, double>;
  if (want[1])
    out[1] = reduce_to_labels(RuntimeTensor<T>(g.layout, g.shape, gx, ReduceOp::sum), pl, mesh,
                              axis_names, dbl);
  if (want[2]) out[2] = reduce_to_labels(g, pl, mesh, axis_names, dbl);
  return out;
}

template <fixed_string Op, fixed_string Label, class P>
constexpr bool parameter_ok() {
  constexpr Layout pl = P::layout;
  if constexpr (pl.rank != 1 || pl.dims[0].label != Label.view()[0]) {
    return sizeof(normalize_error::gain_or_bias_labels_differ_from_the_label<
                  detail::shown<Op>, detail::shown<Label>, detail::shown<P::spec>>) == 0;
  } else {
    return true;
  }
}

template <fixed_string Op, fixed_string Label, class E, class... P>
constexpr bool normalize_ok() {
  if constexpr (Label.view().size() != 1) {
    return sizeof(
               normalize_error::give_exactly_one_label<detail::shown<Op>, detail::shown<Label>>) ==
           0;
  } else if constexpr (E::layout.find(Label.view()[0]) < 0) {
    return sizeof(normalize_error::label_not_in_input<detail::shown<Op>, detail::shown<Label>,
                                                      detail::shown<E::spec>>) == 0;
  } else if constexpr (!std::is_floating_point_v<typename E::value_type>) {
    return sizeof(
               normalize_error::needs_floating_point<detail::shown<Op>, detail::shown<E::spec>>) ==
           0;
  } else {
    return (parameter_ok<Op, Label, P>() && ...);
  }
}

/// The typed normalization: the result has the input's layout without pending partials.
/// Finishing them, and resharding a gain or bias to the input's split of the label, are implicit
/// collectives (strict mode refuses them).
template <Normalization K, fixed_string Op, fixed_string Label, class E, class... P>
auto normalize_typed(double eps, const E& x, const P&... params) {
  if constexpr (!normalize_ok<Op, Label, E, P...>()) {
    return 0;
  } else {
    using T = typename E::value_type;
    using MeshT = typename E::mesh_type;
    static_assert(((std::is_same_v<typename P::value_type, T> &&
                    std::is_same_v<typename P::mesh_type, MeshT>)&&...),
                  "gshard normalization: gain and bias must have the input's element type and "
                  "Mesh type");
    constexpr char label = Label.view()[0];
    constexpr Layout in = E::layout;
    constexpr Layout out = finished_layout(in);
    constexpr Layout need = parameter_layout(out, label);
    using R = Sharded<T, MeshT, spec_of<MeshT, out>()>;
    static_assert(strict_check<MeshT, Op, 0, in, out>());
    static_assert((strict_check<MeshT, Op, 1, P::layout, need>() && ...));
    const std::string op(Op.view());
    const RuntimeTensor<T> v = materialise_as(x, out, op);
    const std::vector<RuntimeTensor<T>> ps{materialise_as(params, need, op)...};
    constexpr bool layer = K == Normalization::layer_norm || K == Normalization::rms_norm;
    bool any_tracked = v.grad != nullptr;
    for (const auto& p : ps) any_tracked = any_tracked || p.grad != nullptr;
    NormStats<T> stats;
    const bool keep = layer && any_tracked && recording();
    const RuntimeTensor<T> r = normalize_runtime<T>(
        K, label, detail::mesh_state(x.mesh()), axis_name_list<MeshT>(), v, eps,
        ps.empty() ? nullptr : &ps[0], ps.size() < 2 ? nullptr : &ps[1], keep ? &stats : nullptr);
    RuntimeTensor<T> result(r.layout, r.shape, r.data, r.partial_op);
    if constexpr (K == Normalization::softmax || K == Normalization::log_softmax) {
      const RuntimeTensor<T> y(r.layout, r.shape, r.data);
      record(x.mesh(), result, op, std::source_location{}, {v.grad},
             [y, m = x.mesh()](const RuntimeTensor<T>& g) {
               return Cotangents{
                   AnyTensor(softmax_cotangent<T>(K == Normalization::log_softmax, label, y, g,
                                                  detail::mesh_state(m), axis_name_list<MeshT>()))};
             });
    } else if (keep) {
      const RuntimeTensor<T> xs(r.layout, r.shape, Kokkos::View<T*>{});
      // Sized up front: GCC 12 misreads push_back on such vectors (-Warray-bounds).
      std::vector<std::shared_ptr<GradNode>> nodes(1 + ps.size());
      std::array<bool, 3> want{};
      nodes[0] = v.grad;
      for (std::size_t i = 0; i < ps.size(); ++i) nodes[i + 1] = ps[i].grad;
      for (std::size_t i = 0; i < nodes.size(); ++i) want[i] = nodes[i] != nullptr;
      record(x.mesh(), result, op, std::source_location{}, std::move(nodes),
             [xs, stats, want, np = ps.size(), m = x.mesh()](const RuntimeTensor<T>& g) {
               Cotangents c =
                   layer_norm_cotangents<T>(K == Normalization::rms_norm, label, xs, stats, want, g,
                                            detail::mesh_state(m), axis_name_list<MeshT>());
               c.resize(1 + np);
               return c;
             });
    }
    return sharded_from<R>(x.mesh(), result);
  }
}

}  // namespace detail

/// exp(x - max) / sum(exp(x - max)) over the label; split label: AllReduce max, AllReduce sum.
template <fixed_string Label, Expression E>
auto softmax(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "softmax");
  return detail::normalize_typed<detail::Normalization::softmax, "softmax", Label>(0.0, x);
}
/// x - max - log(sum(exp(x - max))) over the label; the same two AllReduces as softmax.
template <fixed_string Label, Expression E>
auto log_softmax(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "log_softmax");
  return detail::normalize_typed<detail::Normalization::log_softmax, "log_softmax", Label>(0.0, x);
}
/// (x - mean) / sqrt(var + eps) over the label (biased variance); split label: two AllReduces.
template <fixed_string Label, Expression E>
auto layer_norm(const E& x, double eps = 1e-5,
                std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "layer_norm");
  return detail::normalize_typed<detail::Normalization::layer_norm, "layer_norm", Label>(eps, x);
}
/// layer_norm times a gain over the label.
template <fixed_string Label, Expression E, Expression G>
auto layer_norm(const E& x, const G& gain, double eps = 1e-5,
                std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "layer_norm");
  return detail::normalize_typed<detail::Normalization::layer_norm, "layer_norm", Label>(eps, x,
                                                                                         gain);
}
/// layer_norm times a gain plus a bias, both over the label.
template <fixed_string Label, Expression E, Expression G, Expression B>
auto layer_norm(const E& x, const G& gain, const B& bias, double eps = 1e-5,
                std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "layer_norm");
  return detail::normalize_typed<detail::Normalization::layer_norm, "layer_norm", Label>(
      eps, x, gain, bias);
}
/// x / sqrt(mean(x^2) + eps) over the label; split label: one AllReduce.
template <fixed_string Label, Expression E>
auto rms_norm(const E& x, double eps = 1e-6,
              std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "rms_norm");
  return detail::normalize_typed<detail::Normalization::rms_norm, "rms_norm", Label>(eps, x);
}
/// rms_norm times a gain over the label.
template <fixed_string Label, Expression E, Expression G>
auto rms_norm(const E& x, const G& gain, double eps = 1e-6,
              std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "rms_norm");
  return detail::normalize_typed<detail::Normalization::rms_norm, "rms_norm", Label>(eps, x, gain);
}

}  // namespace gshard
