#pragma once
// gshard::top_k<"S", "K">(x, k): the k largest values along label S and their global indices
// along S, in a new label K of size k that takes S's place, replicated; and
// gshard::one_hot<"E">(indices, size). Over a split S, every rank picks the top k of its shard
// (padding excluded), the candidates of the shards (k values and k indices per line) are
// gathered over S's axes, and every rank merges them. The gradient of the values is their
// cotangent scattered back to the chosen positions: every rank keeps the chosen positions that
// fall in its shard of S (no communication, unless the cotangent is still partial over S's axes:
// one AllReduce finishes it first). The indices and one_hot get no gradient.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../expr/contraction.hpp"
#include "../expr/node.hpp"
#include "../kernels/rows.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/geometry.hpp"
#include "../tensor/local_index.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

namespace topk_error {
template <class>
inline constexpr bool always_false = false;
template <auto Label, auto Spec>
struct label_must_be_one_letter {
  static_assert(always_false<label_must_be_one_letter>,
                "gshard::top_k/one_hot: name each label with one letter, e.g. top_k<\"S\", \"K\">");
};
template <auto Label, auto Spec>
struct top_k_label_not_in_input {
  static_assert(always_false<top_k_label_not_in_input>,
                "gshard::top_k: the label to select over is not a label of the input");
};
template <auto NewLabel, auto Spec>
struct new_label_already_in_input {
  static_assert(always_false<new_label_already_in_input>,
                "gshard::top_k/one_hot: the new label is already a label of the input (other than "
                "the one it replaces)");
};
template <auto NewLabel, auto Spec>
struct one_hot_needs_integer_indices {
  static_assert(always_false<one_hot_needs_integer_indices>,
                "gshard::one_hot: the indices must be an int32_t or int64_t tensor");
};
template <auto NewLabel, auto Spec>
struct one_hot_too_many_labels {
  static_assert(always_false<one_hot_too_many_labels>,
                "gshard::one_hot: the result would have more than 8 labels");
};
}  // namespace topk_error

/// What top_k returns: values (the input's element type) and int64 indices, the same layout.
template <class Values, class Indices>
struct TopK {
  Values values;
  Indices indices;
};

namespace detail {

/// top_k's layout rule: S's dimension becomes K, unsplit (K is replicated over the axes that
/// split S), in S's place; pending partials are finished first, so none remain.
constexpr Layout top_k_layout(const Layout& in, char label, char new_label) {
  Layout out = finished_layout(in);
  const int d = in.find(label);
  out.dims[d] = DimLayout{};
  out.dims[d].label = new_label;
  return out;
}

/// one_hot's layout rule: the indices' layout without pending partials, then E unsplit, last.
constexpr Layout one_hot_layout(const Layout& in, char new_label) {
  Layout out = finished_layout(in);
  out.dims[out.rank] = DimLayout{};
  out.dims[out.rank].label = new_label;
  ++out.rank;
  return out;
}

/// Candidate order: larger value first, ties by smaller index; index -1 (no candidate) last.
template <class T>
KOKKOS_INLINE_FUNCTION bool topk_before(T va, std::int64_t ia, T vb, std::int64_t ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  return va > vb || (va == vb && ia < ib);
}

/// Inserts (value, g) into the best-first list (v, ix) of length k when it belongs there.
template <class T, class I>
KOKKOS_INLINE_FUNCTION void topk_insert(T* v, std::int64_t* ix, const I k, const T value,
                                        const std::int64_t g) {
  if (!topk_before(value, g, v[k - 1], ix[k - 1])) return;
  I p = k - 1;
  for (; p > 0 && topk_before(value, g, v[p - 1], ix[p - 1]); --p) {
    v[p] = v[p - 1];
    ix[p] = ix[p - 1];
  }
  v[p] = value;
  ix[p] = g;
}

/// A best-first list of at most `cap` candidates (index -1: none), the accumulator of the team
/// path: combining two lists is a merge, and topk_before is a total order on (value, index), so
/// the result does not depend on the order the team combines in.
template <class T>
struct TopKList {
  static constexpr int cap = 8;
  T v[cap];
  std::int64_t i[cap];
  int k;
};

template <class T>
struct TopKMerge {
  using Acc = TopKList<T>;
  KOKKOS_INLINE_FUNCTION static Acc identity() {
    Acc a{};
    a.k = 0;
    return a;
  }
  KOKKOS_INLINE_FUNCTION static void combine(Acc& d, const Acc& s) {
    Acc r{};
    r.k = d.k > s.k ? d.k : s.k;
    int a = 0;
    int b = 0;
    for (int j = 0; j < r.k; ++j) {
      const bool from_s = a >= d.k || (b < s.k && topk_before(s.v[b], s.i[b], d.v[a], d.i[a]));
      r.v[j] = from_s ? s.v[b] : d.v[a];
      r.i[j] = from_s ? s.i[b++] : d.i[a++];
    }
    d = r;
  }
};

/// One line's local candidates for reduce_rows: the host path inserts in order (walk), a team
/// merges one-element lists.
template <class T>
struct TopKRows {
  using Reduce = TopKMerge<T>;
  struct State {
    std::int64_t base;
  };
  Kokkos::View<const T*> in;
  Kokkos::View<T*> cv;
  Kokkos::View<std::int64_t*> ci;
  std::int64_t inner, chunk, valid, first;
  int k;
  KOKKOS_INLINE_FUNCTION State begin(const std::int64_t l) const {
    return {(l / inner) * chunk * inner + l % inner};
  }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State&) const { return valid; }
  KOKKOS_INLINE_FUNCTION TopKList<T> term(const State& s, const std::int64_t j) const {
    TopKList<T> a{};
    a.k = k;
    for (int c = 0; c < k; ++c) a.i[c] = -1;
    a.v[0] = in(s.base + j * inner);
    a.i[0] = first + j;
    return a;
  }
  KOKKOS_INLINE_FUNCTION void walk(const State& s, TopKList<T>& a) const {
    a.k = k;
    for (int c = 0; c < k; ++c) {
      a.v[c] = T(0);
      a.i[c] = -1;
    }
    for (std::int64_t j = 0; j < valid; ++j)  // padding never competes
      topk_insert(a.v, a.i, k, in(s.base + j * inner), first + j);
  }
  KOKKOS_INLINE_FUNCTION void finish(const std::int64_t l, const State&,
                                     const TopKList<T>& a) const {
    for (int c = 0; c < k; ++c) {
      const bool has = c < a.k && a.i[c] >= 0;
      cv(l * k + c) = has ? a.v[c] : T(0);
      ci(l * k + c) = has ? a.i[c] : -1;
    }
  }
};

/// Local candidates for k larger than a list holds: one line per thread, in order.
template <class T>
void top_k_lines(const Kokkos::View<const T*>& in, const Kokkos::View<T*>& cv,
                 const Kokkos::View<std::int64_t*>& ci, std::int64_t lines, std::int64_t inner,
                 std::int64_t chunk, std::int64_t valid, std::int64_t first, std::int64_t k) {
  Kokkos::parallel_for(
      "gshard::top_k local", Kokkos::RangePolicy<>(0, lines), KOKKOS_LAMBDA(const std::int64_t l) {
        const std::int64_t base = (l / inner) * chunk * inner + l % inner;
        T* v = &cv(l * k);
        std::int64_t* ix = &ci(l * k);
        for (std::int64_t j = 0; j < k; ++j) {
          v[j] = T(0);
          ix[j] = -1;
        }
        for (std::int64_t j = 0; j < valid; ++j)  // padding never competes
          topk_insert(v, ix, k, in(base + j * inner), first + j);
      });
}

/// The top k on run-time layouts (the typed API and the property tests run this): values and
/// global indices along `label`, in `new_label`'s dimension of size k, layout top_k_layout.
template <class T>
std::pair<RuntimeTensor<T>, RuntimeTensor<std::int64_t>> top_k_runtime(
    const RuntimeTensor<T>& input, char label, char new_label, std::int64_t k,
    const MeshState& mesh, const std::vector<std::string>& axis_names) {
  const int d = input.layout.find(label);
  const std::string what = std::string("over '") + label + "' of \"" +
                           layout_text(input.layout, axis_names) + "\" (global shape " +
                           shape_string(input.shape) + ")";
  if (d < 0) throw Error("top_k", std::string("label '") + label + "' is not in the input " + what);
  if (new_label != label && input.layout.find(new_label) >= 0)
    throw Error("top_k", std::string("the new label '") + new_label +
                             "' is already a label of the input " + what);
  const auto du = static_cast<std::size_t>(d);
  const std::int64_t n = input.shape[du];
  if (k < 1 || k > n)
    throw Error("top_k", "k = " + std::to_string(k) + " " + what + ": k must be in [1, " +
                             std::to_string(n) + "]");
  const RuntimeTensor<T> x = finish_pending(input, mesh, axis_names);

  const Shape ext = local_extents(x.layout, x.shape, mesh.sizes);
  std::int64_t outer = 1;
  std::int64_t inner = 1;
  for (std::size_t e = 0; e < ext.size(); ++e) {
    if (e < du) outer *= ext[e];
    if (e > du) inner *= ext[e];
  }
  const std::int64_t chunk = ext[du];
  const Block blk = block_of(x.layout.dims[d], n, mesh.sizes, mesh.coords);
  const std::int64_t valid = blk.valid;
  const std::int64_t first = blk.offset;
  const std::int64_t lines = outer * inner;

  // This shard's candidates: [line][k], best first.
  Kokkos::View<T*> cv(
      Kokkos::view_alloc(std::string("gshard::top_k candidates"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(lines * k));
  Kokkos::View<std::int64_t*> ci(Kokkos::view_alloc(std::string("gshard::top_k candidate indices"),
                                                    Kokkos::WithoutInitializing),
                                 static_cast<std::size_t>(lines * k));
  // A long line on a device is one team's merge, not one thread's loop (k up to a list's cap:
  // MoE routing and sampling); larger k keeps one thread per line.
  if (lines > 0 && k <= TopKList<T>::cap)
    reduce_rows("gshard::top_k local", lines,
                TopKRows<T>{x.data, cv, ci, inner, chunk, valid, first, static_cast<int>(k)});
  else if (lines > 0)
    top_k_lines<T>(x.data, cv, ci, lines, inner, chunk, valid, first, k);

  // Every shard's candidates, [shard][line][k] (one shard when S is not split).
  unsigned mask = 0;
  int shards = 1;
  for (int i = 0; i < x.layout.dims[d].axis_count; ++i) {
    const int a = x.layout.dims[d].axes[static_cast<std::size_t>(i)];
    if (mesh.sizes[static_cast<std::size_t>(a)] == 1) continue;
    mask |= 1u << a;
    shards *= mesh.sizes[static_cast<std::size_t>(a)];
  }
  Kokkos::View<T*> all_v = cv;
  Kokkos::View<std::int64_t*> all_i = ci;
  if (shards > 1 && lines > 0) {
    const std::string axes = axes_string(mask, axis_names);
    const auto total = static_cast<std::size_t>(lines * k * shards);
    all_v = Kokkos::View<T*>(
        Kokkos::view_alloc(std::string("gshard::top_k gathered"), Kokkos::WithoutInitializing),
        total);
    all_i = Kokkos::View<std::int64_t*>(
        Kokkos::view_alloc(std::string("gshard::top_k gathered indices"),
                           Kokkos::WithoutInitializing),
        total);
    MpiAccess<T> sv(cv, true);
    MpiAccess<T> rv(all_v, false);
    all_gather(sv.data(), rv.data(), lines * k, mesh.groups[mask], axes);
    rv.copy_out();
    MpiAccess<std::int64_t> si(ci, true);
    MpiAccess<std::int64_t> ri(all_i, false);
    all_gather(si.data(), ri.data(), lines * k, mesh.groups[mask], axes);
    ri.copy_out();
  } else {
    shards = 1;
  }

  const Layout out_layout = top_k_layout(x.layout, label, new_label);
  Shape out_shape = x.shape;
  out_shape[du] = k;
  const std::size_t out_size = static_cast<std::size_t>(lines * k);
  RuntimeTensor<T> values{out_layout, out_shape, {}, ReduceOp::sum};
  RuntimeTensor<std::int64_t> indices{out_layout, out_shape, {}, ReduceOp::sum};
  // The merge writes every element, padding included (zeros): no fill.
  values.data = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::top_k values"), Kokkos::WithoutInitializing),
      out_size);
  indices.data = Kokkos::View<std::int64_t*>(
      Kokkos::view_alloc(std::string("gshard::top_k indices"), Kokkos::WithoutInitializing),
      out_size);
  const BlockIndex ob = block_index(out_layout, out_shape, mesh.sizes, mesh.coords);
  const Kokkos::View<T*> ov = values.data;
  const Kokkos::View<std::int64_t*> oi = indices.data;
  Kokkos::parallel_for(
      "gshard::top_k merge", Kokkos::RangePolicy<>(0, lines), KOKKOS_LAMBDA(const std::int64_t l) {
        const std::int64_t base = (l / inner) * k * inner + l % inner;
        for (std::int64_t j = 0; j < k; ++j) {
          ov(base + j * inner) = T(0);
          oi(base + j * inner) = -1;
        }
        if (ob.global_of(base) < 0) {  // a padded line of another dimension: zeros
          for (std::int64_t j = 0; j < k; ++j) oi(base + j * inner) = 0;
          return;
        }
        for (int s = 0; s < shards; ++s) {
          for (std::int64_t c = 0; c < k; ++c) {
            const std::int64_t from = (static_cast<std::int64_t>(s) * lines + l) * k + c;
            const T value = all_v(from);
            const std::int64_t g = all_i(from);
            const std::int64_t last = base + (k - 1) * inner;
            if (!topk_before(value, g, ov(last), oi(last))) break;  // each list is sorted
            std::int64_t p = k - 1;
            for (; p > 0 &&
                   topk_before(value, g, ov(base + (p - 1) * inner), oi(base + (p - 1) * inner));
                 --p) {
              ov(base + p * inner) = ov(base + (p - 1) * inner);
              oi(base + p * inner) = oi(base + (p - 1) * inner);
            }
            ov(base + p * inner) = value;
            oi(base + p * inner) = g;
          }
        }
      });
  return {values, indices};
}

/// The cotangent of top_k's input (layout `x_layout`, finished, global shape `x_shape`) from the
/// values' cotangent g (top_k_layout, possibly partial) and the chosen global `indices` (the same
/// layout, unpartial): g scattered to the chosen positions, zero elsewhere. The result keeps g's
/// partials over axes x_layout does not split.
template <class T>
RuntimeTensor<T> top_k_cotangent(const RuntimeTensor<T>& g,
                                 const RuntimeTensor<std::int64_t>& indices, char label,
                                 const Layout& x_layout, const Shape& x_shape,
                                 const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  const int d = x_layout.find(label);
  const auto du = static_cast<std::size_t>(d);
  // Partials over S's axes must be finished: those axes split the result.
  Layout need = finished_layout(g.layout);
  Layout out_layout = x_layout;
  for (int i = 0; i < g.layout.partial_count; ++i) {
    const int a = g.layout.partial[i];
    if (x_layout.dim_on_axis(a) >= 0) continue;
    need.partial[need.partial_count++] = a;
    out_layout.partial[out_layout.partial_count++] = a;
  }
  const RuntimeTensor<T> gf = bring_sum(g, need, mesh, axis_names);
  const Shape ext = local_extents(x_layout, x_shape, mesh.sizes);
  std::int64_t outer = 1;
  std::int64_t inner = 1;
  for (std::size_t e = 0; e < ext.size(); ++e) {
    if (e < du) outer *= ext[e];
    if (e > du) inner *= ext[e];
  }
  const std::int64_t chunk = ext[du];
  const std::int64_t k = g.shape[du];
  const Block blk = block_of(x_layout.dims[d], x_shape[du], mesh.sizes, mesh.coords);
  const std::int64_t valid = blk.valid;
  const std::int64_t first = blk.offset;
  const std::int64_t lines = outer * inner;
  const Layout values_layout = finished_layout(g.layout);
  const BlockIndex ob = block_index(values_layout, g.shape, mesh.sizes, mesh.coords);
  // Zero-filled: padding and the unchosen positions stay zero.
  Kokkos::View<T*> out("gshard::top_k_grad", static_cast<std::size_t>(product(ext)));
  const Kokkos::View<T*> gv = gf.data;
  const Kokkos::View<std::int64_t*> iv = indices.data;
  Kokkos::parallel_for(
      "gshard::top_k_grad", Kokkos::RangePolicy<>(0, lines), KOKKOS_LAMBDA(const std::int64_t l) {
        const std::int64_t base = (l / inner) * k * inner + l % inner;
        if (ob.global_of(base) < 0) return;  // a padded line of another dimension
        const std::int64_t to = (l / inner) * chunk * inner + l % inner;
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t at = iv(base + j * inner) - first;
          if (at >= 0 && at < valid) out(to + at * inner) += gv(base + j * inner);
        }
      });
  return RuntimeTensor<T>(out_layout, x_shape, out, ReduceOp::sum);
}

/// one_hot on run-time layouts: out[..., e] = 1 where indices[...] == e, else 0; an index
/// outside [0, size) gives a row of zeros. Layout one_hot_layout.
template <class V, class I>
RuntimeTensor<V> one_hot_runtime(const RuntimeTensor<I>& input, char new_label, std::int64_t size,
                                 const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  const std::string what = std::string("'") + new_label + "' for indices \"" +
                           layout_text(input.layout, axis_names) + "\" (global shape " +
                           shape_string(input.shape) + ")";
  if (input.layout.find(new_label) >= 0)
    throw Error("one_hot", "the new label " + what + " is already a label of the indices");
  if (input.layout.rank >= max_dims)
    throw Error("one_hot", "the new label " + what + " would make more than 8 labels");
  if (size < 1)
    throw Error("one_hot", "size " + std::to_string(size) + " of " + what + ": it must be >= 1");
  const RuntimeTensor<I> x = finish_pending(input, mesh, axis_names);
  const BlockIndex ib = block_index(x.layout, x.shape, mesh.sizes, mesh.coords);
  const auto count = static_cast<std::int64_t>(x.data.extent(0));
  RuntimeTensor<V> out{one_hot_layout(x.layout, new_label), x.shape, {}, ReduceOp::sum};
  out.shape.push_back(size);
  out.data = Kokkos::View<V*>(
      Kokkos::view_alloc(std::string("gshard::one_hot"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(count * size));
  const Kokkos::View<I*> in = x.data;
  const Kokkos::View<V*> o = out.data;
  Kokkos::parallel_for(
      "gshard::one_hot", Kokkos::RangePolicy<>(0, count), KOKKOS_LAMBDA(const std::int64_t p) {
        // Padding holds index 0, which must not become a 1.
        const std::int64_t hot = ib.global_of(p) < 0 ? -1 : static_cast<std::int64_t>(in(p));
        for (std::int64_t e = 0; e < size; ++e) o(p * size + e) = e == hot ? V(1) : V(0);
      });
  return out;
}

template <fixed_string Label, class E>
constexpr bool topk_one_letter() {
  if constexpr (Label.size() != 1 || !is_letter(Label.view()[0]))
    return sizeof(topk_error::label_must_be_one_letter<detail::shown<Label>,
                                                       detail::shown<E::spec>>) == 0;
  else
    return true;
}

template <fixed_string Label, fixed_string NewLabel, class E>
constexpr bool check_top_k() {
  if constexpr (!topk_one_letter<Label, E>() || !topk_one_letter<NewLabel, E>()) {
    return false;
  } else if constexpr (E::layout.find(Label.view()[0]) < 0) {
    return sizeof(topk_error::top_k_label_not_in_input<detail::shown<Label>,
                                                       detail::shown<E::spec>>) == 0;
  } else if constexpr (NewLabel.view()[0] != Label.view()[0] &&
                       E::layout.find(NewLabel.view()[0]) >= 0) {
    return sizeof(topk_error::new_label_already_in_input<detail::shown<NewLabel>,
                                                         detail::shown<E::spec>>) == 0;
  } else {
    return true;
  }
}

template <fixed_string NewLabel, class E>
constexpr bool check_one_hot() {
  using I = typename E::value_type;
  if constexpr (!topk_one_letter<NewLabel, E>()) {
    return false;
  } else if constexpr (!std::is_same_v<I, std::int32_t> && !std::is_same_v<I, std::int64_t>) {
    return sizeof(topk_error::one_hot_needs_integer_indices<detail::shown<NewLabel>,
                                                            detail::shown<E::spec>>) == 0;
  } else if constexpr (E::layout.find(NewLabel.view()[0]) >= 0) {
    return sizeof(topk_error::new_label_already_in_input<detail::shown<NewLabel>,
                                                         detail::shown<E::spec>>) == 0;
  } else if constexpr (E::layout.rank >= max_dims) {
    return sizeof(topk_error::one_hot_too_many_labels<detail::shown<NewLabel>,
                                                      detail::shown<E::spec>>) == 0;
  } else {
    return true;
  }
}

}  // namespace detail

/// The k largest values of x along Label (descending, ties by smaller index) and their global
/// indices along Label (int64), in a new label NewLabel of size k in Label's place, replicated
/// over the axes that split Label; the other labels keep their splits. A pending partial sum is
/// finished first (implicit AllReduce; a compile error in strict mode). Throws gshard::Error
/// unless 1 <= k <= the size of Label. Collective over the mesh when Label is split.
template <fixed_string Label, fixed_string NewLabel, Expression E>
auto top_k(const E& x, std::int64_t k,
           std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "top_k");
  if constexpr (!detail::check_top_k<Label, NewLabel, E>()) {
    return 0;
  } else {
    using T = typename E::value_type;
    using MeshT = typename E::mesh_type;
    constexpr Layout in_layout = detail::finished_layout(E::layout);
    constexpr Layout out_layout =
        detail::top_k_layout(E::layout, Label.view()[0], NewLabel.view()[0]);
    constexpr auto spec = detail::spec_of<MeshT, out_layout>();
    static_assert(detail::strict_check<MeshT, "top_k", 0, E::layout, in_layout>());
    using V = Sharded<T, MeshT, spec>;
    using I = Sharded<std::int64_t, MeshT, spec>;
    const auto in = detail::materialise_as(x, in_layout, "top_k");
    constexpr char label = Label.view()[0];
    auto r = detail::top_k_runtime(in, label, NewLabel.view()[0], k, detail::mesh_state(x.mesh()),
                                   detail::axis_name_list<MeshT>());
    if constexpr (detail::differentiable_v<T>) {
      detail::record(x.mesh(), r.first, "top_k", std::source_location{}, {in.grad},
                     [indices = r.second, xl = in.layout, xs = in.shape,
                      m = x.mesh()](const detail::RuntimeTensor<T>& g) {
                       return detail::Cotangents{detail::AnyTensor(detail::top_k_cotangent<T>(
                           g, indices, Label.view()[0], xl, xs, detail::mesh_state(m),
                           detail::axis_name_list<MeshT>()))};
                     });
    }
    return TopK<V, I>{detail::sharded_from<V>(x.mesh(), r.first),
                      I(x.mesh(), r.second.shape, r.second.data)};
  }
}

/// A one-hot encoding of integer indices: a new label NewLabel of `size`, unsplit, appended
/// after the indices' labels; out[..., e] = 1 where indices[...] == e, else 0. An index outside
/// [0, size) gives an all-zero row. The value type is V (default float). A pending partial sum of
/// the indices is finished first. No communication otherwise.
template <fixed_string NewLabel, class V = float, Expression E>
auto one_hot(const E& indices, std::int64_t size,
             std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "one_hot");
  if constexpr (!detail::check_one_hot<NewLabel, E>()) {
    return 0;
  } else {
    using MeshT = typename E::mesh_type;
    constexpr Layout in_layout = detail::finished_layout(E::layout);
    constexpr Layout out_layout = detail::one_hot_layout(E::layout, NewLabel.view()[0]);
    static_assert(detail::strict_check<MeshT, "one_hot", 0, E::layout, in_layout>());
    using R = Sharded<V, MeshT, detail::spec_of<MeshT, out_layout>()>;
    const auto in = detail::materialise_as(indices, in_layout, "one_hot");
    const auto r =
        detail::one_hot_runtime<V>(in, NewLabel.view()[0], size, detail::mesh_state(indices.mesh()),
                                   detail::axis_name_list<MeshT>());
    return R(indices.mesh(), r.shape, r.data);
  }
}

}  // namespace gshard
