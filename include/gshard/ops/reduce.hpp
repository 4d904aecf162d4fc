#pragma once
// Reductions over one or more labels: sum<"SM">(x), mean, max, min, argmax, argmin (int64: the
// global index), logsumexp, norm (L2). The result keeps the input's other labels with their
// splits. sum and mean are linear: over a split label they leave a pending partial sum (no
// communication, like einsum rule 3) and keep the input's pending sums. The others finish at
// once: a pending input is finished first, then a local reduction over the valid elements
// (padding acts as the identity) and AllReduce(s) over the reduced labels' axes.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../comm/collectives.hpp"
#include "../expr/contraction.hpp"
#include "../expr/node.hpp"
#include "../kernels/math.hpp"
#include "../kernels/rows.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

namespace reduce_error {
template <class>
inline constexpr bool always_false = false;
template <auto Op, auto Label, auto InputSpec>
struct label_not_in_input {
  static_assert(always_false<label_not_in_input>,
                "gshard reduction: a reduced label is not a label of the input (op, label, "
                "input spec: the arguments above)");
};
template <auto Op, auto Label, auto Labels>
struct label_repeated {
  static_assert(always_false<label_repeated>,
                "gshard reduction: a label appears twice in the labels to reduce over");
};
template <auto Op, auto InputSpec>
struct no_labels_to_reduce {
  static_assert(always_false<no_labels_to_reduce>,
                "gshard reduction: give at least one label to reduce over, e.g. sum<\"S\">(x)");
};
template <auto Op, auto InputSpec>
struct needs_floating_point {
  static_assert(always_false<needs_floating_point>,
                "gshard reduction: mean, logsumexp and norm need float or double elements");
};
}  // namespace reduce_error

namespace detail {

enum class Reduction { sum, mean, max, min, argmax, argmin, logsumexp, norm };

inline const char* reduction_name(Reduction k) {
  switch (k) {
    case Reduction::sum:
      return "sum";
    case Reduction::mean:
      return "mean";
    case Reduction::max:
      return "max";
    case Reduction::min:
      return "min";
    case Reduction::argmax:
      return "argmax";
    case Reduction::argmin:
      return "argmin";
    case Reduction::logsumexp:
      return "logsumexp";
    case Reduction::norm:
      return "norm";
  }
  return "?";
}

/// sum and mean may leave (and keep) pending partial sums; every other reduction finishes them.
constexpr bool reduction_is_linear(Reduction k) {
  return k == Reduction::sum || k == Reduction::mean;
}

/// What is wrong with the labels to reduce over: 0 none, 1 not in the input, 2 repeated,
/// 3 empty; `at` is the offending position in `labels`.
struct ReduceLabelCheck {
  int error = 0;
  std::size_t at = 0;
};

constexpr ReduceLabelCheck check_reduce_labels(std::string_view labels, const Layout& in) {
  if (labels.empty()) return {3, 0};
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (in.find(labels[i]) < 0) return {1, i};
    for (std::size_t j = 0; j < i; ++j)
      if (labels[j] == labels[i]) return {2, i};
  }
  return {0, 0};
}

/// The result's layout: the input's other labels, in its order, with their axes. A linear
/// reduction is partial over the reduced labels' axes (in the input's dimension order), then
/// over the input's pending axes (einsum's order, so sum<"G">(x) types as einsum<"GSM->SM">).
constexpr Layout reduce_layout(const Layout& in, std::string_view labels, bool linear) {
  Layout out{};
  for (int d = 0; d < in.rank; ++d)
    if (!has_label(labels, in.dims[d].label)) out.dims[out.rank++] = in.dims[d];
  if (linear) {
    for (int d = 0; d < in.rank; ++d)
      if (has_label(labels, in.dims[d].label))
        for (int i = 0; i < in.dims[d].axis_count; ++i)
          out.partial[out.partial_count++] = in.dims[d].axes[i];
    for (int i = 0; i < in.partial_count; ++i) out.partial[out.partial_count++] = in.partial[i];
  }
  return out;
}

/// The mesh axes (bitmask) that split the labels in `labels`.
constexpr unsigned reduced_axes(const Layout& in, std::string_view labels) {
  unsigned mask = 0;
  for (int d = 0; d < in.rank; ++d)
    if (has_label(labels, in.dims[d].label)) mask |= axes_of(in.dims[d]);
  return mask;
}

/// This rank's block seen as (kept dimensions) x (reduced dimensions): for each output element
/// (row-major over the kept padded extents) the reduction visits only the valid reduced
/// elements, so padding never enters (it acts as the identity of every reduction).
struct ReduceShape {
  int kept = 0;
  int reduced = 0;
  std::int64_t kept_ext[max_dims]{};
  std::int64_t kept_valid[max_dims]{};
  std::int64_t kept_stride[max_dims]{};
  std::int64_t red_valid[max_dims]{};
  std::int64_t red_stride[max_dims]{};
  std::int64_t red_offset[max_dims]{};
  std::int64_t red_gstride[max_dims]{};  // global flat index, row-major in `labels` order
  std::int64_t out_size = 1;             // padded kept block
  std::int64_t red_count = 1;            // valid reduced elements on this rank
  std::int64_t global_count = 1;         // reduced elements in the global tensor

  /// The input offset of kept row `row`; `pad` says whether the row is padding.
  KOKKOS_INLINE_FUNCTION std::int64_t row_base(std::int64_t row, bool& pad) const {
    std::int64_t base = 0;
    pad = false;
    for (int d = kept - 1; d >= 0; --d) {
      const std::int64_t i = row % kept_ext[d];
      row /= kept_ext[d];
      pad = pad || i >= kept_valid[d];
      base += i * kept_stride[d];
    }
    return base;
  }
};

inline ReduceShape reduce_shape(const Layout& l, const Shape& shape, const MeshState& mesh,
                                std::string_view labels) {
  ReduceShape g;
  const Shape ext = local_extents(l, shape, mesh.sizes);
  std::int64_t stride[max_dims]{};
  std::int64_t s = 1;
  for (int d = l.rank; d-- > 0;) {
    stride[d] = s;
    s *= ext[static_cast<std::size_t>(d)];
  }
  for (int d = 0; d < l.rank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    const Block b = block_of(l.dims[d], shape[du], mesh.sizes, mesh.coords);
    const std::size_t pos = labels.find(l.dims[d].label);
    if (pos == std::string_view::npos) {
      g.kept_ext[g.kept] = ext[du];
      g.kept_valid[g.kept] = b.valid;
      g.kept_stride[g.kept] = stride[d];
      g.out_size *= ext[du];
      ++g.kept;
    } else {
      std::int64_t gs = 1;
      for (std::size_t j = pos + 1; j < labels.size(); ++j)
        gs *= shape[static_cast<std::size_t>(l.find(labels[j]))];
      g.red_valid[g.reduced] = b.valid;
      g.red_stride[g.reduced] = stride[d];
      g.red_offset[g.reduced] = b.offset;
      g.red_gstride[g.reduced] = gs;
      g.red_count *= b.valid;
      g.global_count *= shape[du];
      ++g.reduced;
    }
  }
  return g;
}

enum class LocalReduce { sum, max, min, sumsq, sumexp, sumsqdev, argmax, argmin };

/// The accumulator of a reduction kind: identity and combination (kernels/rows.hpp). Arg-max/min
/// carry the winner's global flat index: the smallest on ties, so the result does not depend on
/// the order in which a team combines.
template <LocalReduce K, class T>
struct ReduceKind {
  static constexpr bool arg = K == LocalReduce::argmax || K == LocalReduce::argmin;
  static constexpr std::int64_t none = std::numeric_limits<std::int64_t>::max();
  struct ArgAcc {
    T value;
    std::int64_t index;
  };
  using Acc = std::conditional_t<arg, ArgAcc, T>;
  // Constants, not calls: device code may read a constexpr variable but not call numeric_limits.
  static constexpr T lowest_value = std::is_floating_point_v<T>
                                        ? -std::numeric_limits<T>::infinity()
                                        : std::numeric_limits<T>::lowest();
  static constexpr T highest_value = std::is_floating_point_v<T>
                                         ? std::numeric_limits<T>::infinity()
                                         : std::numeric_limits<T>::max();
  KOKKOS_INLINE_FUNCTION static T lowest() { return lowest_value; }
  KOKKOS_INLINE_FUNCTION static T highest() { return highest_value; }
  KOKKOS_INLINE_FUNCTION static Acc identity() {
    if constexpr (K == LocalReduce::max)
      return lowest();
    else if constexpr (K == LocalReduce::min)
      return highest();
    else if constexpr (K == LocalReduce::argmax)
      return ArgAcc{lowest(), none};
    else if constexpr (K == LocalReduce::argmin)
      return ArgAcc{highest(), none};
    else
      return T{};
  }
  KOKKOS_INLINE_FUNCTION static void combine(Acc& dest, const Acc& src) {
    if constexpr (K == LocalReduce::max) {
      dest = src > dest ? src : dest;
    } else if constexpr (K == LocalReduce::min) {
      dest = src < dest ? src : dest;
    } else if constexpr (arg) {
      if (src.index == none) return;
      const bool better =
          K == LocalReduce::argmax ? src.value > dest.value : src.value < dest.value;
      if (dest.index == none || better || (src.value == dest.value && src.index < dest.index))
        dest = src;
    } else {
      dest += src;
    }
  }
};

/// The row kernel of local_reduce_kind (kernels/rows.hpp): row o of the output reduces this
/// rank's valid elements of the reduced labels. A named functor: nvcc's extended lambdas cannot
/// capture a variable first named inside `if constexpr`.
template <LocalReduce K, class T>
struct ReduceRows {
  using Reduce = ReduceKind<K, T>;
  using Acc = typename Reduce::Acc;
  static constexpr bool floating = std::is_floating_point_v<T>;
  ReduceShape g;
  Kokkos::View<T*> in, out, shift;
  Kokkos::View<std::int64_t*> index;
  int last;
  std::int64_t inner, inner_stride, inner_offset, inner_gstride, outer;

  ReduceRows(const ReduceShape& shape, const Kokkos::View<T*>& in_, const Kokkos::View<T*>& out_,
             const Kokkos::View<T*>& shift_, const Kokkos::View<std::int64_t*>& index_)
      : g(shape),
        in(in_),
        out(out_),
        shift(shift_),
        index(index_),
        last(shape.reduced - 1),
        inner(last >= 0 ? shape.red_valid[last] : 1),
        inner_stride(last >= 0 ? shape.red_stride[last] : 0),
        inner_offset(last >= 0 ? shape.red_offset[last] : 0),
        inner_gstride(last >= 0 ? shape.red_gstride[last] : 0),
        outer(inner == 0 ? 0 : shape.red_count / inner) {}

  struct State {
    std::int64_t base;
    bool pad;
    T m;  // the shift of sumexp and sumsqdev
  };
  KOKKOS_INLINE_FUNCTION State begin(const std::int64_t o) const {
    State s{0, false, T{}};
    s.base = g.row_base(o, s.pad);
    if constexpr (K == LocalReduce::sumexp || K == LocalReduce::sumsqdev)
      if (!s.pad) s.m = shift(o);
    // exp(x - m) with m = -inf (every element -inf) would be NaN; 0 gives 0 terms.
    if constexpr (K == LocalReduce::sumexp)
      if (s.m == Reduce::lowest()) s.m = T{};
    return s;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State& s) const {
    return s.pad ? 0 : g.red_count;
  }
  KOKKOS_INLINE_FUNCTION Acc value(const State& s, const T v, const std::int64_t gv) const {
    if constexpr (K == LocalReduce::sumsq) {
      return v * v;
    } else if constexpr (K == LocalReduce::sumexp) {
      if constexpr (floating)
        return math::exp(v - s.m);
      else
        return T{};
    } else if constexpr (K == LocalReduce::sumsqdev) {
      return (v - s.m) * (v - s.m);
    } else if constexpr (Reduce::arg) {
      return Acc{v, gv};
    } else {
      (void)s;
      (void)gv;
      return v;
    }
  }
  /// Element j of the row, j over the reduced labels in row-major order of their valid extents.
  KOKKOS_INLINE_FUNCTION Acc term(const State& s, std::int64_t j) const {
    std::int64_t at = s.base;
    std::int64_t gi = 0;
    for (int d = g.reduced - 1; d >= 0; --d) {
      const std::int64_t i = j % g.red_valid[d];
      j /= g.red_valid[d];
      at += i * g.red_stride[d];
      gi += (g.red_offset[d] + i) * g.red_gstride[d];
    }
    return value(s, in(at), gi);
  }
  /// The host path: the innermost reduced label as a strided loop, the others as an odometer.
  KOKKOS_INLINE_FUNCTION void walk(const State& s, Acc& acc) const {
    if (s.pad) return;
    std::int64_t idx[max_dims] = {};
    for (std::int64_t r = 0; r < outer; ++r) {
      std::int64_t at = s.base;
      std::int64_t gi = 0;
      for (int d = 0; d < last; ++d) {
        at += idx[d] * g.red_stride[d];
        gi += (g.red_offset[d] + idx[d]) * g.red_gstride[d];
      }
      for (std::int64_t i = 0; i < inner; ++i)
        Reduce::combine(
            acc, value(s, in(at + i * inner_stride), gi + (inner_offset + i) * inner_gstride));
      for (int d = last - 1; d >= 0; --d) {  // odometer over the other reduced dimensions
        if (++idx[d] < g.red_valid[d]) break;
        idx[d] = 0;
      }
    }
  }
  KOKKOS_INLINE_FUNCTION void finish(const std::int64_t o, const State& s, const Acc& acc) const {
    if constexpr (Reduce::arg) {
      out(o) = s.pad ? T{} : acc.value;
      index(o) = s.pad ? 0 : acc.index;
    } else {
      out(o) = s.pad ? T{} : acc;
    }
  }
};

/// out[o] = the reduction of this rank's valid elements of row o; padded rows get 0. sumexp
/// sums exp(x - shift[o]) and sumsqdev (x - shift[o])^2; argmax/argmin also write the global
/// flat index of the winner (smallest on ties; INT64_MAX when this rank has no element). The kind
/// is a template argument and the innermost reduced dimension a plain strided loop (the others
/// advance as an odometer), so the inner loop has no division and no branch on the kind.
template <LocalReduce K, class T>
void local_reduce_kind(const ReduceShape& g, const Kokkos::View<T*>& in,
                       const Kokkos::View<T*>& out, const Kokkos::View<T*>& shift,
                       const Kokkos::View<std::int64_t*>& index) {
  reduce_rows("gshard::reduce", g.out_size, ReduceRows<K, T>(g, in, out, shift, index));
}

template <class T>
void local_reduce(LocalReduce kind, const ReduceShape& g, const Kokkos::View<T*>& in,
                  const Kokkos::View<T*>& out, const Kokkos::View<T*>& shift,
                  const Kokkos::View<std::int64_t*>& index) {
  switch (kind) {
    case LocalReduce::sum:
      return local_reduce_kind<LocalReduce::sum>(g, in, out, shift, index);
    case LocalReduce::max:
      return local_reduce_kind<LocalReduce::max>(g, in, out, shift, index);
    case LocalReduce::min:
      return local_reduce_kind<LocalReduce::min>(g, in, out, shift, index);
    case LocalReduce::sumsq:
      return local_reduce_kind<LocalReduce::sumsq>(g, in, out, shift, index);
    case LocalReduce::sumexp:
      return local_reduce_kind<LocalReduce::sumexp>(g, in, out, shift, index);
    case LocalReduce::sumsqdev:
      return local_reduce_kind<LocalReduce::sumsqdev>(g, in, out, shift, index);
    case LocalReduce::argmax:
      return local_reduce_kind<LocalReduce::argmax>(g, in, out, shift, index);
    case LocalReduce::argmin:
      return local_reduce_kind<LocalReduce::argmin>(g, in, out, shift, index);
  }
}

/// In-place AllReduce of a whole View over the axes in `mask`; nothing when they multiply to 1
/// (as the reshard planner elides steps over size-1 axes).
template <class T>
void all_reduce_axes(const Kokkos::View<T*>& v, ReduceOp op, const MeshState& mesh, unsigned mask,
                     const std::vector<std::string>& axis_names) {
  if (group_size_of(mask, mesh.sizes) == 1) return;
  MpiAccess<T> h(v, true);
  all_reduce(h.data(), static_cast<std::int64_t>(v.extent(0)), op, mesh.groups[mask],
             axes_string(mask, axis_names));
  h.copy_out();
}

inline std::string describe_input(const Layout& l, const Shape& shape,
                                  const std::vector<std::string>& axis_names,
                                  const char* what = "input") {
  std::string s = what;
  s += ' ';
  s += quoted_layout(l, axis_names);
  s += " of global shape ";
  s += shape_string(shape);
  return s;
}

/// Run-time checks every rank makes alike (they depend on layouts and shapes only).
inline void check_reduce_input(const std::string& op, std::string_view labels, const Layout& l,
                               const Shape& shape, bool needs_elements,
                               const std::vector<std::string>& axis_names) {
  const ReduceLabelCheck c = check_reduce_labels(labels, l);
  const std::string input = describe_input(l, shape, axis_names);
  const std::string over = std::string(" (over \"") + std::string(labels) + "\")";
  if (c.error == 3) throw Error(op, std::string("no labels to reduce over, ") + input);
  if (c.error == 1)
    throw Error(op,
                std::string("label '") + labels[c.at] + "' is not a label of the " + input + over);
  if (c.error == 2)
    throw Error(op,
                std::string("label '") + labels[c.at] + "' appears twice" + over + ", " + input);
  if (needs_elements)
    for (char c2 : labels)
      if (shape[static_cast<std::size_t>(l.find(c2))] == 0)
        throw Error(op, std::string("label '") + c2 + "' has size 0, nothing to reduce" + over +
                            ", " + input);
}

template <class T>
struct Reduced {
  RuntimeTensor<T> value;
  RuntimeTensor<std::int64_t> index;  // argmax/argmin only
};

/// The whole sharded reduction on run-time layouts (the typed API and the property tests both
/// run this). Collective over the mesh.
template <class T>
Reduced<T> reduce_runtime(Reduction kind, std::string_view labels, const MeshState& mesh,
                          const std::vector<std::string>& axis_names, const RuntimeTensor<T>& in) {
  const std::string op = reduction_name(kind);
  const bool linear = reduction_is_linear(kind);
  check_reduce_input(op, labels, in.layout, in.shape,
                     kind != Reduction::sum && kind != Reduction::norm, axis_names);
  if (linear && in.layout.partial_count > 0 && in.partial_op != ReduceOp::sum)
    throw Error(op, std::string("the ") + describe_input(in.layout, in.shape, axis_names) +
                        " holds pending max/min partials, which a sum cannot keep; finish them "
                        "with reshard first");
  if constexpr (!std::is_floating_point_v<T>)
    if (kind == Reduction::mean || kind == Reduction::logsumexp || kind == Reduction::norm)
      throw Error(op, "needs float or double elements");
  const RuntimeTensor<T> x = linear ? in : finish_pending(in, mesh, axis_names);
  const ReduceShape g = reduce_shape(x.layout, x.shape, mesh, labels);
  const unsigned mask = reduced_axes(x.layout, labels);
  Reduced<T> r;
  r.value.layout = reduce_layout(x.layout, labels, linear);
  for (int d = 0; d < x.layout.rank; ++d)
    if (labels.find(x.layout.dims[d].label) == std::string_view::npos)
      r.value.shape.push_back(x.shape[static_cast<std::size_t>(d)]);
  auto fresh = [&](const char* name) {
    return Kokkos::View<T*>(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing),
                            g.out_size);
  };
  Kokkos::View<T*> out = fresh("gshard::reduce");
  const Kokkos::View<T*> none;
  const Kokkos::View<std::int64_t*> no_index;
  switch (kind) {
    case Reduction::sum:
    case Reduction::mean: {
      local_reduce<T>(LocalReduce::sum, g, x.data, out, none, no_index);
      if constexpr (std::is_floating_point_v<T>) {
        if (kind != Reduction::mean) break;
        const T scale = static_cast<T>(1) / static_cast<T>(g.global_count);
        Kokkos::parallel_for(
            "gshard::mean", Kokkos::RangePolicy<>(0, g.out_size),
            KOKKOS_LAMBDA(const std::int64_t i) { out(i) *= scale; });
      }
      break;
    }
    case Reduction::max:
    case Reduction::min: {
      const bool max = kind == Reduction::max;
      local_reduce<T>(max ? LocalReduce::max : LocalReduce::min, g, x.data, out, none, no_index);
      all_reduce_axes(out, max ? ReduceOp::max : ReduceOp::min, mesh, mask, axis_names);
      break;
    }
    case Reduction::argmax:
    case Reduction::argmin: {
      const bool max = kind == Reduction::argmax;
      Kokkos::View<std::int64_t*> index(
          Kokkos::view_alloc(std::string("gshard::arg"), Kokkos::WithoutInitializing), g.out_size);
      local_reduce<T>(max ? LocalReduce::argmax : LocalReduce::argmin, g, x.data, out, none, index);
      if (group_size_of(mask, mesh.sizes) > 1) {
        // The winning value first, then the smallest index among the ranks that hold it.
        const Kokkos::View<T*> local = fresh("gshard::arg local");
        Kokkos::deep_copy(local, out);
        all_reduce_axes(out, max ? ReduceOp::max : ReduceOp::min, mesh, mask, axis_names);
        constexpr std::int64_t none_here = std::numeric_limits<std::int64_t>::max();
        Kokkos::parallel_for(
            "gshard::arg candidates", Kokkos::RangePolicy<>(0, g.out_size),
            KOKKOS_LAMBDA(const std::int64_t i) {
              if (!(local(i) == out(i))) index(i) = none_here;
            });
        all_reduce_axes(index, ReduceOp::min, mesh, mask, axis_names);
      }
      r.index = RuntimeTensor<std::int64_t>{r.value.layout, r.value.shape, index, ReduceOp::sum};
      break;
    }
    case Reduction::logsumexp:
    case Reduction::norm:
      if constexpr (std::is_floating_point_v<T>) {
        if (kind == Reduction::norm) {
          local_reduce<T>(LocalReduce::sumsq, g, x.data, out, none, no_index);
          all_reduce_axes(out, ReduceOp::sum, mesh, mask, axis_names);
          Kokkos::parallel_for(
              "gshard::norm", Kokkos::RangePolicy<>(0, g.out_size),
              KOKKOS_LAMBDA(const std::int64_t i) { out(i) = math::sqrt(out(i)); });
          break;
        }
        local_reduce<T>(LocalReduce::max, g, x.data, out, none, no_index);
        all_reduce_axes(out, ReduceOp::max, mesh, mask, axis_names);
        Kokkos::View<T*> s = fresh("gshard::logsumexp sum");
        local_reduce<T>(LocalReduce::sumexp, g, x.data, s, out, no_index);
        all_reduce_axes(s, ReduceOp::sum, mesh, mask, axis_names);
        const T lowest = -std::numeric_limits<T>::infinity();
        Kokkos::parallel_for(
            "gshard::logsumexp", Kokkos::RangePolicy<>(0, g.out_size),
            KOKKOS_LAMBDA(const std::int64_t i) {
              // Padded rows hold max 0 and sum 0: keep them 0.
              if (s(i) == T{} && out(i) == T{}) return;
              if (out(i) == lowest) return;  // every element -inf: the result is -inf
              out(i) += math::log(s(i));
            });
      }
      break;
  }
  r.value.data = out;
  return r;
}

/// The gradient of a reduction: the result's cotangent broadcast back along the reduced labels,
/// times d(result)/dx: 1 (sum), 1/count (mean), the indicator of the extremum (max, min; every
/// tie gets it), exp(x - result) (logsumexp), x / result (norm).
template <class T>
RuntimeTensor<T> reduce_cotangent(Reduction kind, double count, const RuntimeTensor<T>& x,
                                  const RuntimeTensor<T>& result, const RuntimeTensor<T>& g,
                                  const MeshState& mesh,
                                  const std::vector<std::string>& axis_names) {
  const RuntimeTensor<T> gb = broadcast_runtime(g, x.layout, x.shape, mesh, axis_names);
  if (kind == Reduction::sum) return gb;
  Kokkos::View<T*> out(
      Kokkos::view_alloc(std::string("gshard::reduce_grad"), Kokkos::WithoutInitializing),
      gb.data.extent(0));
  const Kokkos::View<T*> gv = gb.data;
  if (kind == Reduction::mean) {
    const T scale = static_cast<T>(1.0 / count);
    Kokkos::parallel_for(
        "gshard::reduce_grad", Kokkos::RangePolicy<>(0, out.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) { out(i) = gv(i) * scale; });
  } else {
    const Kokkos::View<T*> xv = x.data;
    const Kokkos::View<T*> rv =
        broadcast_runtime(result, finished_layout(x.layout), x.shape, mesh, axis_names).data;
    const bool extremum = kind == Reduction::max || kind == Reduction::min;
    const bool lse = kind == Reduction::logsumexp;
    Kokkos::parallel_for(
        "gshard::reduce_grad", Kokkos::RangePolicy<>(0, out.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) {
          const T d =
              extremum ? T(xv(i) == rv(i) ? 1 : 0)
                       : (lse ? math::exp(xv(i) - rv(i)) : (rv(i) != T(0) ? xv(i) / rv(i) : T(0)));
          out(i) = gv(i) * d;
        });
  }
  return RuntimeTensor<T>(gb.layout, gb.shape, out, ReduceOp::sum);
}

template <Reduction K, fixed_string Op, fixed_string Labels, class E>
constexpr bool reduce_ok() {
  constexpr ReduceLabelCheck c = check_reduce_labels(Labels.view(), E::layout);
  if constexpr (c.error == 3) {
    return sizeof(reduce_error::no_labels_to_reduce<detail::shown<Op>, detail::shown<E::spec>>) ==
           0;
  } else if constexpr (c.error == 1) {
    constexpr auto label = make_fixed<1>(Labels.view().substr(c.at, 1));
    return sizeof(reduce_error::label_not_in_input<detail::shown<Op>, detail::shown<label>,
                                                   detail::shown<E::spec>>) == 0;
  } else if constexpr (c.error == 2) {
    constexpr auto label = make_fixed<1>(Labels.view().substr(c.at, 1));
    return sizeof(reduce_error::label_repeated<detail::shown<Op>, detail::shown<label>,
                                               detail::shown<Labels>>) == 0;
  } else if constexpr ((K == Reduction::mean || K == Reduction::logsumexp ||
                        K == Reduction::norm) &&
                       !std::is_floating_point_v<typename E::value_type>) {
    return sizeof(reduce_error::needs_floating_point<detail::shown<Op>, detail::shown<E::spec>>) ==
           0;
  } else {
    return true;
  }
}

/// The typed reduction: the result type from reduce_layout at compile time; a non-linear one
/// finishes the input's pending sums first (an implicit collective: strict mode refuses it).
template <Reduction K, fixed_string Op, fixed_string Labels, class E>
auto reduce_typed(const E& x) {
  if constexpr (!reduce_ok<K, Op, Labels, E>()) {
    return 0;
  } else {
    using T = typename E::value_type;
    using MeshT = typename E::mesh_type;
    constexpr bool linear = reduction_is_linear(K);
    constexpr Layout in = E::layout;
    constexpr Layout out = reduce_layout(in, Labels.view(), linear);
    constexpr bool arg = K == Reduction::argmax || K == Reduction::argmin;
    using V = std::conditional_t<arg, std::int64_t, T>;
    using R = Sharded<V, MeshT, spec_of<MeshT, out>()>;
    if constexpr (!linear) static_assert(strict_check<MeshT, Op, 0, in, finished_layout(in)>());
    const RuntimeTensor<T> v =
        linear ? materialise(x) : materialise_as(x, finished_layout(in), std::string(Op.view()));
    Reduced<T> r =
        reduce_runtime<T>(K, Labels.view(), x.mesh().state(), axis_name_list<MeshT>(), v);
    if constexpr (arg) {
      return R(x.mesh(), r.index.shape, r.index.data);
    } else {
      if constexpr (differentiable_v<T>) {
        if (v.grad && recording()) {
          double count = 1;
          for (char c : Labels.view())
            count *= static_cast<double>(v.shape[static_cast<std::size_t>(v.layout.find(c))]);
          // A sum or mean needs only the input's layout and shape, not its values.
          const bool values = K != Reduction::sum && K != Reduction::mean;
          const RuntimeTensor<T> xs(v.layout, v.shape, values ? v.data : Kokkos::View<T*>{},
                                    v.partial_op);
          const RuntimeTensor<T> res(r.value.layout, r.value.shape,
                                     values ? r.value.data : Kokkos::View<T*>{});
          record(x.mesh(), r.value, std::string(Op.view()) + "<" + std::string(Labels.view()) + ">",
                 std::source_location{}, {v.grad},
                 [xs, res, count, m = x.mesh()](const RuntimeTensor<T>& g) {
                   return Cotangents{AnyTensor(reduce_cotangent<T>(K, count, xs, res, g, m.state(),
                                                                   axis_name_list<MeshT>()))};
                 });
        }
      }
      return sharded_from<R>(x.mesh(), r.value);
    }
  }
}

}  // namespace detail

/// Sum over the labels: partial over their axes (no communication); pending sums stay pending.
template <fixed_string Labels, Expression E>
auto sum(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "sum");
  return detail::reduce_typed<detail::Reduction::sum, "sum", Labels>(x);
}
/// Mean over the labels (the sum divided by their global sizes): partial like sum.
template <fixed_string Labels, Expression E>
auto mean(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "mean");
  return detail::reduce_typed<detail::Reduction::mean, "mean", Labels>(x);
}
/// Maximum over the labels; over a split label one AllReduce (max) of the result's block.
template <fixed_string Labels, Expression E>
auto max(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "max");
  return detail::reduce_typed<detail::Reduction::max, "max", Labels>(x);
}
/// Minimum over the labels; over a split label one AllReduce (min).
template <fixed_string Labels, Expression E>
auto min(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "min");
  return detail::reduce_typed<detail::Reduction::min, "min", Labels>(x);
}
/// The global index (int64) of the maximum: row-major over the labels in the order written;
/// the smallest on ties. Over a split label: AllReduce max of values, AllReduce min of indices.
template <fixed_string Labels, Expression E>
auto argmax(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "argmax");
  return detail::reduce_typed<detail::Reduction::argmax, "argmax", Labels>(x);
}
/// As argmax, for the minimum.
template <fixed_string Labels, Expression E>
auto argmin(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "argmin");
  return detail::reduce_typed<detail::Reduction::argmin, "argmin", Labels>(x);
}
/// log(sum(exp(x))), stable: AllReduce max, then AllReduce sum of exp(x - max).
template <fixed_string Labels, Expression E>
auto logsumexp(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "logsumexp");
  return detail::reduce_typed<detail::Reduction::logsumexp, "logsumexp", Labels>(x);
}
/// The L2 norm: AllReduce sum of squares, then sqrt.
template <fixed_string Labels, Expression E>
auto norm(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "norm");
  return detail::reduce_typed<detail::Reduction::norm, "norm", Labels>(x);
}

}  // namespace gshard
