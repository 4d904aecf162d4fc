#pragma once
// The reductions' local kernel (ops/reduce.hpp): one rank's block seen as kept x reduced
// dimensions, the accumulator of each kind and the row kernel that visits only valid elements.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "../../kernels/math.hpp"
#include "../../kernels/rows.hpp"
#include "../../tensor/sharded.hpp"
#include "rules.hpp"

namespace gshard {
namespace detail {

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

}  // namespace detail
}  // namespace gshard
