#pragma once
// gshard::cumsum<"S">(x) and gshard::exclusive_cumsum<"S">(x): cumulative sums along a label, in
// the input's layout. Each rank scans its padded block along S; when S is split, ONE exclusive
// scan of the shard totals along S's axes (MPI_Exscan on their sub-communicator) gives each shard
// the sum of the shards before it, which is added back. A cumulative sum is linear, so pending
// partial sums stay pending (each copy's scan is a partial of the scan). The gradient is the
// reverse scan of the cotangent along the label (inclusive for cumsum, exclusive for
// exclusive_cumsum), sharded the same way; its shard offsets are the totals of the LATER shards,
// which ONE AllGather of the shard totals over the label's axes gives (MPI_Exscan only runs in
// rank order).
#include <Kokkos_Core.hpp>

#include <array>
#include <cstdint>
#include <source_location>
#include <string>
#include <vector>

#include "../comm/collectives.hpp"
#include "../expr/node.hpp"
#include "../kernels/rows.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/geometry.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

namespace scan_error {
template <class>
inline constexpr bool always_false = false;
template <auto Label, auto Spec>
struct scan_label_must_be_one_letter {
  static_assert(always_false<scan_label_must_be_one_letter>,
                "gshard::cumsum: name the label to scan over with one letter, e.g. cumsum<\"S\">");
};
template <auto Label, auto Spec>
struct scan_label_not_in_input {
  static_assert(always_false<scan_label_not_in_input>,
                "gshard::cumsum: the label to scan over is not a label of the input");
};
}  // namespace scan_error

namespace detail {

/// How a label's shards sit on the mesh: its axes of size > 1 (size-1 axes change nothing), in
/// the spec's order (major first), their mask, the shard count and this rank's shard.
/// `mesh_order`: those axes are in ascending mesh order, so the ranks of groups[mask]
/// (row-major in mesh order) are in shard order.
struct ScanAxes {
  std::vector<int> axes;
  unsigned mask = 0;
  int shards = 1;
  int my_shard = 0;
  bool mesh_order = true;
};

inline ScanAxes scan_axes(const DimLayout& dim, const MeshState& mesh) {
  ScanAxes s;
  for (int i = 0; i < dim.axis_count; ++i) {
    const int a = dim.axes[static_cast<std::size_t>(i)];
    const int size = mesh.sizes[static_cast<std::size_t>(a)];
    if (size == 1) continue;
    if (!s.axes.empty() && a < s.axes.back()) s.mesh_order = false;
    s.axes.push_back(a);
    s.mask |= 1u << a;
    s.shards *= size;
    s.my_shard = s.my_shard * size + mesh.coords[static_cast<std::size_t>(a)];
  }
  return s;
}

/// The shard (spec order) of group rank r of groups[mask] (row-major in mesh order).
inline int scan_shard_of_group_rank(const ScanAxes& s, int r, const MeshState& mesh) {
  std::array<int, max_axes> c{};
  for (int a = max_axes; a-- > 0;) {
    if (!(s.mask & (1u << a))) continue;
    const int size = mesh.sizes[static_cast<std::size_t>(a)];
    c[static_cast<std::size_t>(a)] = r % size;
    r /= size;
  }
  int shard = 0;
  for (int a : s.axes)
    shard = shard * mesh.sizes[static_cast<std::size_t>(a)] + c[static_cast<std::size_t>(a)];
  return shard;
}

/// The cumulative sum on run-time layouts (the typed API and the property tests run this).
/// Result: x's layout and shape; padding zero. Pending sum partials stay pending; pending max/min
/// partials are refused (the scan is not linear in them), like einsum. `reverse`: sums over the
/// elements AFTER each one (from the end of the label), the gradient of the forward scan.
/// The local scan of each line (kernels/rows.hpp's two paths): on the host one iteration per
/// line, in order; on devices one team per line with a team scan. Padding is written 0 and each
/// line's total goes to `totals` (the other shards' offsets come from it).
template <class T>
struct CumsumLines {
  Kokkos::View<T*> in, o, totals;
  std::int64_t inner, chunk, valid;
  bool reverse, exclusive;
  using Member = Kokkos::TeamPolicy<>::member_type;

  KOKKOS_INLINE_FUNCTION std::int64_t base(const std::int64_t l) const {
    return (l / inner) * chunk * inner + l % inner;
  }
  // Reverse: the valid elements from the last.
  KOKKOS_INLINE_FUNCTION std::int64_t at(const std::int64_t b, const std::int64_t step) const {
    return b + (reverse ? valid - 1 - step : step) * inner;
  }
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t l) const {
    const std::int64_t b = base(l);
    T run = T(0);
    for (std::int64_t step = 0; step < valid; ++step) {
      const std::int64_t i = at(b, step);
      const T v = in(i);
      o(i) = exclusive ? run : run + v;
      run += v;
    }
    for (std::int64_t j = valid; j < chunk; ++j) o(b + j * inner) = T(0);
    totals(l) = run;
  }
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t l = team.league_rank();
    const std::int64_t b = base(l);
    Kokkos::parallel_scan(Kokkos::TeamThreadRange(team, valid),
                          [&](const std::int64_t step, T& partial, const bool final) {
                            const std::int64_t i = at(b, step);
                            const T v = in(i);
                            if (final) o(i) = exclusive ? partial : partial + v;
                            partial += v;
                          });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, valid, chunk),
                         [&](const std::int64_t j) { o(b + j * inner) = T(0); });
    T total = T(0);
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, valid),
        [&](const std::int64_t step, T& acc) { acc += in(at(b, step)); }, total);
    Kokkos::single(Kokkos::PerTeam(team), [&]() { totals(l) = total; });
  }
};

/// Adds each line's offset (the earlier shards' totals) to its valid elements.
template <class T>
struct AddOffsetRows {
  Kokkos::View<T*> o, offsets;
  std::int64_t inner, chunk, valid;
  struct State {
    std::int64_t base;
    T add;
  };
  KOKKOS_INLINE_FUNCTION State begin(const std::int64_t l) const {
    return {(l / inner) * chunk * inner + l % inner, offsets(l)};
  }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State&) const { return valid; }
  KOKKOS_INLINE_FUNCTION void element(const State& s, const std::int64_t j) const {
    o(s.base + j * inner) += s.add;
  }
};

template <class T>
RuntimeTensor<T> cumsum_runtime(const RuntimeTensor<T>& x, char label, bool exclusive,
                                const MeshState& mesh, const std::vector<std::string>& axis_names,
                                bool reverse = false) {
  const std::string op =
      std::string(reverse ? "reverse " : "") + (exclusive ? "exclusive_cumsum" : "cumsum");
  const int d = x.layout.find(label);
  if (d < 0)
    throw Error(op, std::string("label '") + label + "' is not in the input \"" +
                        layout_text(x.layout, axis_names) + "\" (global shape " +
                        shape_string(x.shape) + ")");
  if (x.layout.partial_count > 0 && x.partial_op != ReduceOp::sum)
    throw Error(op, std::string("the input \"") + layout_text(x.layout, axis_names) +
                        "\" holds pending max/min partials; finish them with reshard first");
  const auto du = static_cast<std::size_t>(d);
  const Shape ext = local_extents(x.layout, x.shape, mesh.sizes);
  std::int64_t outer = 1;
  std::int64_t inner = 1;
  for (std::size_t e = 0; e < ext.size(); ++e) {
    if (e < du) outer *= ext[e];
    if (e > du) inner *= ext[e];
  }
  const std::int64_t chunk = ext[du];
  const std::int64_t valid = block_of(x.layout.dims[d], x.shape[du], mesh.sizes, mesh.coords).valid;
  const std::int64_t lines = outer * inner;

  RuntimeTensor<T> out{x.layout, x.shape, {}, x.partial_op};
  // The kernel writes every element, padding included (zeros): no fill.
  out.data = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::cumsum"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(product(ext)));
  Kokkos::View<T*> totals(
      Kokkos::view_alloc(std::string("gshard::cumsum totals"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(lines));
  const Kokkos::View<T*> in = x.data;
  const Kokkos::View<T*> o = out.data;
  const CumsumLines<T> lines_kernel{in, o, totals, inner, chunk, valid, reverse, exclusive};
  run_rows("gshard::cumsum local", lines, lines_kernel);

  const ScanAxes s = scan_axes(x.layout.dims[d], mesh);
  if (s.shards == 1 || lines == 0) return out;
  const std::string axes = axes_string(s.mask, axis_names);
  Kokkos::View<T*> offsets(
      Kokkos::view_alloc(std::string("gshard::cumsum offsets"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(lines));
  {
    MpiAccess<T> tot(totals, true);
    if (s.mesh_order && !reverse) {
      MpiAccess<T> off(offsets, false);
      exscan(tot.data(), off.data(), lines, ReduceOp::sum, T(0), mesh.groups[s.mask], axes);
      off.copy_out();
    } else {
      // Shard order (spec order of the axes) differs from the group's rank order (mesh order),
      // or the scan runs backwards: gather every shard's totals (k values per line) and add
      // those of the earlier (reverse: later) shards, on the host.
      std::vector<T> all(static_cast<std::size_t>(lines * s.shards));
      all_gather(tot.data(), all.data(), lines, mesh.groups[s.mask], axes);
      std::vector<T> host(static_cast<std::size_t>(lines), T(0));
      for (int r = 0; r < s.shards; ++r) {
        const int shard = scan_shard_of_group_rank(s, r, mesh);
        if (reverse ? shard <= s.my_shard : shard >= s.my_shard) continue;
        const T* from = all.data() + static_cast<std::int64_t>(r) * lines;
        for (std::int64_t l = 0; l < lines; ++l) host[static_cast<std::size_t>(l)] += from[l];
      }
      Kokkos::deep_copy(offsets, Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(
                                     host.data(), host.size()));
    }
  }
  for_each_row("gshard::cumsum offsets", lines, AddOffsetRows<T>{o, offsets, inner, chunk, valid});
  return out;
}

template <fixed_string Label, class E>
constexpr bool check_scan_label() {
  if constexpr (Label.size() != 1 || !is_letter(Label.view()[0])) {
    return sizeof(scan_error::scan_label_must_be_one_letter<detail::shown<Label>,
                                                            detail::shown<E::spec>>) == 0;
  } else if constexpr (E::layout.find(Label.view()[0]) < 0) {
    return sizeof(
               scan_error::scan_label_not_in_input<detail::shown<Label>, detail::shown<E::spec>>) ==
           0;
  } else {
    return true;
  }
}

template <class E>
using scan_result_t = Sharded<typename E::value_type, typename E::mesh_type,
                              spec_of<typename E::mesh_type, E::layout>()>;

template <fixed_string Label, class E>
scan_result_t<E> cumsum_typed(const E& x, bool exclusive) {
  using R = scan_result_t<E>;
  using MeshT = typename E::mesh_type;
  using T = typename E::value_type;
  constexpr char label = Label.view()[0];
  const RuntimeTensor<T> in = materialise(x);
  RuntimeTensor<T> r =
      cumsum_runtime(in, label, exclusive, detail::mesh_state(x.mesh()), axis_name_list<MeshT>());
  if constexpr (differentiable_v<T>) {
    record(x.mesh(), r, exclusive ? "exclusive_cumsum" : "cumsum", std::source_location{},
           {in.grad}, [exclusive, m = x.mesh()](const RuntimeTensor<T>& g) {
             // g has the result's (= the input's) layout; the reverse scan keeps its partials.
             return Cotangents{
                 AnyTensor(cumsum_runtime(g, Label.view()[0], exclusive, detail::mesh_state(m),
                                          axis_name_list<MeshT>(), true))};
           });
  }
  return sharded_from<R>(x.mesh(), r);
}

}  // namespace detail

/// Inclusive cumulative sum along Label: out[.., i, ..] = sum of x[.., j, ..] for j <= i. The
/// result has the input's layout (pending partial sums stay pending). Collective over the mesh
/// when Label is split: one ExScan of the shard totals along Label's axes.
template <fixed_string Label, Expression E>
auto cumsum(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "cumsum");
  if constexpr (!detail::check_scan_label<Label, E>())
    return 0;
  else
    return detail::cumsum_typed<Label>(x, false);
}

/// Exclusive cumulative sum along Label: out[.., i, ..] = sum of x[.., j, ..] for j < i.
template <fixed_string Label, Expression E>
auto exclusive_cumsum(const E& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "exclusive_cumsum");
  if constexpr (!detail::check_scan_label<Label, E>())
    return 0;
  else
    return detail::cumsum_typed<Label>(x, true);
}

}  // namespace gshard
