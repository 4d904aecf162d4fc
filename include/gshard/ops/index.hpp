#pragma once
// Index ops: take<"V">(table, indices) (gather along a label; the embedding lookup when the table
// is split over its vocabulary label, as Megatron does it) and scatter_add<"V">(values, indices,
// n), its transpose. The local kernels and the partition rules live side by side here.
//
// Rules (constexpr, the same functions at compile time and in the run-time engine):
//   take<"V">(table "V M...", indices "B S...") -> "B S... M..." (the indices' labels, then the
//   table's other labels). The index labels keep the indices' splits; a table label keeps its
//   axes when the indices do not use them (else it is replicated: the table is gathered). When
//   the indices use none of V's axes, V stays split: every rank looks up only the indices that
//   fall in its vocabulary shard (zeros elsewhere) and the result is a pending partial sum over
//   V's axes (no communication). Otherwise the table is gathered over V first. The table's
//   pending partial sums stay pending over axes the indices do not use.
//   scatter_add<"V">(values "B S... M...", indices "B S...", n) -> "V M..." (V first, replicated,
//   then the values' other labels with their axes). The indices are brought to the values' splits
//   of the index labels; each rank adds its own values, so the result is a pending partial sum
//   over those axes (and over the values' own pending axes): no communication for the data.
//
// Out-of-range indices throw gshard::Error on every rank. Ranks that hold different index
// shards must agree, so each rank checks its own shard and one AllReduce of 3 integers runs over
// exactly the mesh axes that split the indices (none when the indices are replicated, as in the
// usual embedding lookup). That check is not a reshard, so strict mode does not reject it.
//
// Gradients (the table's, the values'; indices get none): the backward of take is a scatter_add
// of the cotangent at the indices the lookup used, straight into the table's layout of V in the
// lookup (each rank adds into its own vocabulary shard when V stayed split, so the embedding
// gradient is never replicated at the table's size), partial over the axes splitting the
// indices; the backward of scatter_add is a take of the cotangent. Neither re-checks the indices
// nor communicates; the driver finishes the partial sums when it brings the cotangent home.
//
// Batched (MoE dispatch/combine): take_along<"S">(table, indices) and its transpose
// scatter_add_along<"S", "Batch">(values, indices, n). Labels shared by the table and the indices
// are batch labels; a negative index means "no element" (zero row, no gradient, nothing added).
//   take_along: table "G S M", indices "G E C" -> "G E C M". The indices keep their splits; the
//   table's batch labels take them, S is replicated (the table is gathered over S if split), the
//   table's other labels keep their axes where the indices leave them free; table partials stay
//   pending over the free axes. So batch labels split alike and S unsplit: no data moves.
//   scatter_add_along: values "G E C M", indices "G E C", Batch "G" -> "G S M" (batch labels in
//   the values' order, S replicated, the values' labels the indices lack). The values stay; the
//   indices take their splits; pending over the axes of the non-batch index labels (E, C).
// Bounds::checked (the default) runs the same one-AllReduce check as take (indices >= n throw on
// every rank); Bounds::trusted skips it, so the fast path then runs no collective at all.
// Gradients: take_along's table cotangent is a local scatter of g at the used indices (in g's
// splits); scatter_add_along's values cotangent is a take_along of g.
//
// The parts: ops/index/rules.hpp (rules, compile-time errors and checks), kernels/gather.hpp
// (the gather and scatter kernels), ops/index/take.hpp (take and scatter_add on run-time
// layouts), ops/index/along.hpp (the `_along` pair); the typed API is here.
#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>

#include "../expr/node.hpp"
#include "../tensor/sharded.hpp"
#include "index/along.hpp"
#include "index/rules.hpp"
#include "index/take.hpp"

namespace gshard {

/// take<"V">(table, indices): table[indices[b, s...], m...] for every (b, s..., m...). Labels:
/// the indices', then the table's other labels; layout by detail::take_layouts (see the top of
/// this file). Eager; collective over the mesh (an AllReduce of 3 integers over the axes that
/// split the indices checks them; reshards when the rule needs them).
template <fixed_string Label, Expression Table, Expression Indices>
auto take(const Table& table, const Indices& indices,
          std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "take");
  if constexpr (!detail::check_take<Label, Table, Indices>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename Table::mesh_type, typename Indices::mesh_type>,
                  "gshard::take: the table and the indices must be on the same Mesh type");
    using T = typename Table::value_type;
    using MeshT = typename Table::mesh_type;
    constexpr detail::TakeLayouts L =
        detail::take_layouts(Table::layout, Indices::layout, Label.data[0]);
    static_assert(detail::strict_check<MeshT, "take", 0, Table::layout, L.table>() &&
                  detail::strict_check<MeshT, "take", 1, Indices::layout, L.indices>());
    // The engine brings both to the rule's layouts, so its messages name the layouts given.
    using I = typename Indices::value_type;
    const auto i = detail::materialise(indices);
    const auto t = detail::materialise(table);
    const MeshT& mesh = table.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::take_runtime<T>(
        Label.data[0], detail::mesh_state(mesh), detail::axis_name_list<MeshT>(), t, i, &L, &used);
    if constexpr (detail::differentiable_v<T>) {
      constexpr char label = Label.data[0];
      constexpr DimLayout vdim = L.table.dims[Table::layout.find(label)];
      const std::int64_t n = t.shape[static_cast<std::size_t>(t.layout.find(label))];
      detail::record(mesh, r, std::string("take<\"") + label + "\">", where, {t.grad},
                     [used, n, vdim, m = mesh](const detail::RuntimeTensor<T>& g) {
                       return detail::Cotangents{detail::AnyTensor(detail::take_cotangent<T, I>(
                           Label.data[0], n, vdim, used, g, detail::mesh_state(m)))};
                     });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

/// The embedding lookup: take<"V">(table, ids). With the table split over V and the ids
/// replicated over V's axes, each rank looks up its vocabulary shard and the result is a pending
/// partial sum over those axes (no communication until it is finished).
template <fixed_string Label, Expression Table, Expression Indices>
auto embedding(const Table& table, const Indices& ids,
               std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "embedding");
  return take<Label>(table, ids, where);
}

/// scatter_add<"V">(values, indices, n): a zero tensor with label V of size n first, then the
/// values' labels that the indices lack; out[indices[b, s...], m...] += values[b, s..., m...].
/// The transpose of take. Layout by detail::scatter_layouts. Eager; collective over the mesh.
template <fixed_string Label, Expression Values, Expression Indices>
auto scatter_add(const Values& values, const Indices& indices, std::int64_t n,
                 std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "scatter_add");
  if constexpr (!detail::check_scatter<Label, Values, Indices>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename Values::mesh_type, typename Indices::mesh_type>,
                  "gshard::scatter_add: the values and the indices must be on the same Mesh type");
    using T = typename Values::value_type;
    using MeshT = typename Values::mesh_type;
    constexpr detail::ScatterLayouts L =
        detail::scatter_layouts(Values::layout, Indices::layout, Label.data[0]);
    static_assert(detail::strict_check<MeshT, "scatter_add", 1, Indices::layout, L.indices>());
    using I = typename Indices::value_type;
    const auto v = detail::materialise(values);
    const auto i = detail::materialise(indices);
    const MeshT& mesh = values.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::scatter_add_runtime<T>(
        Label.data[0], n, detail::mesh_state(mesh), detail::axis_name_list<MeshT>(), v, i, &used);
    if constexpr (detail::differentiable_v<T>) {
      constexpr char label = Label.data[0];
      detail::record(
          mesh, r, std::string("scatter_add<\"") + label + "\">", where, {v.grad},
          [used, m = mesh](const detail::RuntimeTensor<T>& g) {
            return detail::Cotangents{detail::AnyTensor(detail::scatter_add_cotangent<T, I>(
                label, used, g, detail::mesh_state(m), detail::axis_name_list<MeshT>()))};
          });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

/// take_along<"S">(table, indices): numpy's take_along_axis / torch.gather by labels. Labels of
/// both operands (other than S) are batch labels (same sizes); the indices may add labels.
/// Result: the indices' labels, then the table's labels other than S and the batch labels, e.g.
/// table "G S M", indices "G E C" -> "G E C M" with r[g, e, c, m] = table[g, idx[g, e, c], m];
/// a negative index gives a zero row (and no gradient). Layout by detail::take_along_layouts:
/// batch labels split alike in both and S not split -> local, no collective other than the
/// bounds check (none with Bounds::trusted). Eager; collective over the mesh.
template <fixed_string Label, Expression Table, Expression Indices>
auto take_along(const Table& table, const Indices& indices, Bounds bounds = Bounds::checked,
                std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "take_along");
  if constexpr (!detail::check_take_along<Label, Table, Indices>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename Table::mesh_type, typename Indices::mesh_type>,
                  "gshard::take_along: the table and the indices must be on the same Mesh type");
    using T = typename Table::value_type;
    using I = typename Indices::value_type;
    using MeshT = typename Table::mesh_type;
    constexpr char label = Label.data[0];
    constexpr detail::AlongLayouts L =
        detail::take_along_layouts(Table::layout, Indices::layout, label);
    static_assert(detail::strict_check<MeshT, "take_along", 0, Table::layout, L.data>() &&
                  detail::strict_check<MeshT, "take_along", 1, Indices::layout, L.indices>());
    const auto i = detail::materialise(indices);
    const auto t = detail::materialise(table);
    const MeshT& mesh = table.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::take_along_runtime<T, I>(
        label, detail::mesh_state(mesh), detail::axis_name_list<MeshT>(), t, i, bounds, &used);
    if constexpr (detail::differentiable_v<T>) {
      const std::int64_t n = t.shape[static_cast<std::size_t>(t.layout.find(label))];
      detail::record(
          mesh, r, std::string("take_along<\"") + label + "\">", where, {t.grad},
          [used, n, m = mesh](const detail::RuntimeTensor<T>& g) {
            return detail::Cotangents{detail::AnyTensor(detail::take_along_cotangent<T, I>(
                label, n, Table::layout, used, g, detail::mesh_state(m)))};
          });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

/// scatter_add_along<"S", "G">(values, indices, n): the transpose of take_along. Batch names the
/// batch labels (letters, e.g. "G" or "GH"; each a label of the indices; default none): the
/// result is the batch labels in the values' order, then S of size n, then the values' labels
/// the indices lack, e.g. values "G E C M", indices "G E C", Batch "G" -> "G S M" with
/// out[g, idx[g, e, c], m] += values[g, e, c, m]; negative indices add nothing. Layout by
/// detail::scatter_along_layouts: the values stay, the indices take their splits; pending over
/// the axes of the values' non-batch index labels. Eager; collective over the mesh.
template <fixed_string Label, fixed_string Batch = "", Expression Values, Expression Indices>
auto scatter_add_along(const Values& values, const Indices& indices, std::int64_t n,
                       Bounds bounds = Bounds::checked,
                       std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "scatter_add_along");
  if constexpr (!detail::check_scatter_along<Label, Batch, Values, Indices>()) {
    return 0;
  } else {
    static_assert(
        std::is_same_v<typename Values::mesh_type, typename Indices::mesh_type>,
        "gshard::scatter_add_along: the values and the indices must be on the same Mesh type");
    using T = typename Values::value_type;
    using I = typename Indices::value_type;
    using MeshT = typename Values::mesh_type;
    constexpr char label = Label.data[0];
    constexpr detail::AlongLayouts L =
        detail::scatter_along_layouts(Values::layout, Indices::layout, label, Batch.view());
    static_assert(
        detail::strict_check<MeshT, "scatter_add_along", 1, Indices::layout, L.indices>());
    const auto v = detail::materialise(values);
    const auto i = detail::materialise(indices);
    const MeshT& mesh = values.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::scatter_add_along_runtime<T, I>(
        label, Batch.view(), n, detail::mesh_state(mesh), detail::axis_name_list<MeshT>(), v, i,
        bounds, &used);
    if constexpr (detail::differentiable_v<T>) {
      detail::record(
          mesh, r, std::string("scatter_add_along<\"") + label + "\">", where, {v.grad},
          [used, m = mesh](const detail::RuntimeTensor<T>& g) {
            return detail::Cotangents{detail::AnyTensor(detail::scatter_add_along_cotangent<T, I>(
                label, Values::layout, used, g, detail::mesh_state(m),
                detail::axis_name_list<MeshT>()))};
          });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

}  // namespace gshard
