#pragma once
// take and scatter_add on run-time layouts (and their cotangents), with the helpers the
// `_along` pair shares: bringing operands to a rule's layout, the collective range check of the
// indices, the local block's dimensions.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "../../comm/collectives.hpp"
#include "../../expr/node.hpp"
#include "../../kernels/gather.hpp"
#include "../../spmd/reshard.hpp"
#include "../../tensor/sharded.hpp"
#include "rules.hpp"

namespace gshard {
namespace detail {

namespace index_ops {

inline std::string describe(const Layout& l, const Shape& shape,
                            const std::vector<std::string>& names) {
  std::string s = quoted_layout(l, names);
  s += " of shape ";
  s += shape_string(shape);
  return s;
}

/// `t` in layout `need` (same labels): resharded when the layouts differ.
template <class T>
RuntimeTensor<T> bring(const RuntimeTensor<T>& t, const Layout& need, const MeshState& mesh,
                       const std::vector<std::string>& names, const std::string& op) {
  if (t.layout == need) return t;
  if (t.partial_op != ReduceOp::sum && need.partial_count > 0)
    throw Error(op, "an operand holds pending max/min partials; finish them with reshard first");
  return reshard_runtime(t, need, mesh, names);
}

/// The non-trivial mesh axes (size > 1) that split some dimension of `l`, as a mask.
inline unsigned nontrivial_split_mask(const Layout& l, const std::array<int, max_axes>& sizes) {
  unsigned mask = 0;
  for (int d = 0; d < l.rank; ++d)
    for (int i = 0; i < l.dims[d].axis_count; ++i)
      if (sizes[static_cast<std::size_t>(l.dims[d].axes[i])] > 1) mask |= 1u << l.dims[d].axes[i];
  return mask;
}

/// Throws on every rank when some index lies outside [0, n) (or is >= n, when negative_ok). Each
/// rank scans its own shard; ranks holding different shards agree through one AllReduce (max of:
/// any bad, the largest bad value, minus the smallest) over the axes that split the indices.
template <class I>
void check_indices(const RuntimeTensor<I>& idx, std::int64_t n, const MeshState& mesh,
                   const std::vector<std::string>& names, const std::string& op,
                   const std::string& context, bool negative_ok = false) {
  auto host = Kokkos::create_mirror_view(idx.data);
  Kokkos::deep_copy(host, idx.data);
  BlockIndex b = block_index(idx.layout, idx.shape, mesh.sizes, mesh.coords);
  b.holds_values = true;
  std::int64_t found[3] = {0, INT64_MIN, INT64_MIN};  // any bad, max bad, -(min bad)
  const auto count = static_cast<std::int64_t>(host.extent(0));
  for (std::int64_t i = 0; i < count; ++i) {
    if (b.global_of(i) < 0) continue;
    const auto v = static_cast<std::int64_t>(host(i));
    if ((v >= 0 || negative_ok) && v < n) continue;
    found[0] = 1;
    found[1] = v > found[1] ? v : found[1];
    found[2] = -v > found[2] ? -v : found[2];
  }
  const unsigned mask = nontrivial_split_mask(idx.layout, mesh.sizes);
  if (mask != 0) all_reduce(found, 3, ReduceOp::max, mesh.groups[mask], axes_string(mask, names));
  if (found[0] == 0) return;
  const std::string range =
      negative_ok ? "below " + std::to_string(n) + " (a negative index means no element)"
                  : "in [0, " + std::to_string(n) + ")";
  throw Error(op, context + ": indices must lie " + range + "; found values from " +
                      std::to_string(-found[2]) + " to " + std::to_string(found[1]) +
                      " outside it");
}

/// Per dimension of a local block: padded extent, valid extent, global offset, local stride.
struct LocalDims {
  std::int64_t extent[max_dims]{};
  std::int64_t valid[max_dims]{};
  std::int64_t offset[max_dims]{};
  std::int64_t stride[max_dims]{};
  std::int64_t size = 1;
};

inline LocalDims local_dims(const Layout& l, const Shape& shape, const MeshState& mesh) {
  LocalDims r;
  for (int d = l.rank - 1; d >= 0; --d) {
    const Block b =
        block_of(l.dims[d], shape[static_cast<std::size_t>(d)], mesh.sizes, mesh.coords);
    r.extent[d] = b.chunk;
    r.valid[d] = b.valid;
    r.offset[d] = b.offset;
    r.stride[d] = r.size;
    r.size *= b.chunk;
  }
  return r;
}

}  // namespace index_ops

/// take along `label` on run-time layouts: bring the operands to the rule's layouts, check the
/// indices, look up locally. The typed take below and the property tests both run this.
/// `used_indices` receives the indices in the layout the lookup used (kept for the backward);
/// check = false skips the range check (indices already checked by the forward pass).
template <class T, class I>
RuntimeTensor<T> take_runtime(char label, const MeshState& mesh,
                              const std::vector<std::string>& names, const RuntimeTensor<T>& table,
                              const RuntimeTensor<I>& indices, const TakeLayouts* fixed = nullptr,
                              RuntimeTensor<I>* used_indices = nullptr, bool check = true) {
  using namespace index_ops;
  const std::string op = std::string("take<\"") + label + "\">";
  const std::string context = "table " + describe(table.layout, table.shape, names) + ", indices " +
                              describe(indices.layout, indices.shape, names);
  const int vd = table.layout.find(label);
  if (vd < 0) throw Error(op, context + ": the table has no label '" + label + "'");
  for (int d = 0; d < indices.layout.rank; ++d)
    if (table.layout.find(indices.layout.dims[d].label) >= 0)
      throw Error(op, context + ": label '" + indices.layout.dims[d].label +
                          "' is in both the table and the indices");
  const TakeLayouts rules = fixed ? *fixed : take_layouts(table.layout, indices.layout, label);
  if (!rules.ok) throw Error(op, context + ": the result would have more than 8 labels");
  const std::int64_t n = table.shape[static_cast<std::size_t>(vd)];
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  if (check) check_indices(idx, n, mesh, names, op, context);
  if (used_indices) *used_indices = idx;
  const RuntimeTensor<T> tab = bring(table, rules.table, mesh, names, op);
  if (tab.partial_op != ReduceOp::sum && rules.output.partial_count > 0)
    throw Error(op, context +
                        ": the table holds pending max/min partials; finish them with "
                        "reshard first");
  RuntimeTensor<T> out{rules.output, idx.shape, {}, ReduceOp::sum};
  for (int d = 0; d < tab.layout.rank; ++d)
    if (d != vd) out.shape.push_back(tab.shape[static_cast<std::size_t>(d)]);
  const LocalDims lo = local_dims(out.layout, out.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  const LocalDims lt = local_dims(tab.layout, tab.shape, mesh);
  GatherMap m;
  m.rank = out.layout.rank;
  for (int d = 0; d < m.rank; ++d) {
    m.extent[d] = lo.extent[d];
    m.valid[d] = lo.valid[d];
    if (d < idx.layout.rank) {
      m.a_stride[d] = li.stride[d];
    } else {
      m.b_stride[d] = lt.stride[tab.layout.find(out.layout.dims[d].label)];
    }
  }
  m.v_stride = lt.stride[vd];
  m.v_offset = lt.offset[vd];
  m.v_valid = lt.valid[vd];
  out.data = gather<T, I>("gshard::take", m, lo.size, idx.data, tab.data);
  return out;
}

namespace index_ops {

/// The local half of scatter_add: `values` into a zeroed `label` dimension of size n laid out as
/// `vdim` (its axes must be free in `values`), the indices already in the values' splits of the
/// index labels and checked. Each rank adds the values whose index falls in its own block of
/// `vdim` (all of them when `vdim` is replicated): the result is "V M..." partial over the axes
/// that split the values' index labels and over the values' own pending axes.
template <class T, class I>
RuntimeTensor<T> scatter_local(char label, std::int64_t n, const DimLayout& vdim,
                               const MeshState& mesh, const RuntimeTensor<T>& values,
                               const RuntimeTensor<I>& idx) {
  Layout l = scatter_layouts(values.layout, idx.layout, label).output;
  l.dims[0].axis_count = vdim.axis_count;
  l.dims[0].axes = vdim.axes;
  RuntimeTensor<T> out{l, {n}, {}, ReduceOp::sum};
  for (int d = 0; d < values.layout.rank; ++d)
    if (idx.layout.find(values.layout.dims[d].label) < 0)
      out.shape.push_back(values.shape[static_cast<std::size_t>(d)]);
  const LocalDims lo = local_dims(out.layout, out.shape, mesh);
  const LocalDims lv = local_dims(values.layout, values.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  GatherMap m;  // the loop runs over the values' block
  m.rank = values.layout.rank;
  for (int d = 0; d < m.rank; ++d) {
    m.extent[d] = lv.extent[d];
    m.valid[d] = lv.valid[d];
    const char c = values.layout.dims[d].label;
    const int id = idx.layout.find(c);
    if (id >= 0)
      m.a_stride[d] = li.stride[id];
    else
      m.b_stride[d] = lo.stride[out.layout.find(c)];
  }
  m.v_stride = lo.stride[0];
  m.v_offset = lo.offset[0];
  m.v_valid = lo.valid[0];
  out.data = Kokkos::View<T*>("gshard::scatter_add", static_cast<std::size_t>(lo.size));
  scatter_into<T, I>("gshard::scatter_add", m, lv.size, out.data, idx.data, values.data);
  return out;
}

}  // namespace index_ops

/// scatter_add into a zeroed `label` dimension of size n, on run-time layouts.
/// `used_indices` receives the indices in the layout the scatter used (kept for the backward).
template <class T, class I>
RuntimeTensor<T> scatter_add_runtime(char label, std::int64_t n, const MeshState& mesh,
                                     const std::vector<std::string>& names,
                                     const RuntimeTensor<T>& values,
                                     const RuntimeTensor<I>& indices,
                                     RuntimeTensor<I>* used_indices = nullptr) {
  using namespace index_ops;
  const std::string op = std::string("scatter_add<\"") + label + "\">";
  const std::string context = "values " + describe(values.layout, values.shape, names) +
                              ", indices " + describe(indices.layout, indices.shape, names) +
                              ", size " + std::to_string(n);
  if (n < 0) throw Error(op, context + ": the size must not be negative");
  if (values.layout.find(label) >= 0)
    throw Error(op, context + ": the values already have label '" + label + "'");
  for (int d = 0; d < indices.layout.rank; ++d) {
    const int vd = values.layout.find(indices.layout.dims[d].label);
    if (vd < 0)
      throw Error(op, context + ": index label '" + indices.layout.dims[d].label +
                          "' is not a label of the values");
    if (values.shape[static_cast<std::size_t>(vd)] != indices.shape[static_cast<std::size_t>(d)])
      throw Error(op, context + ": label '" + indices.layout.dims[d].label + "' has size " +
                          std::to_string(values.shape[static_cast<std::size_t>(vd)]) +
                          " in the values but " +
                          std::to_string(indices.shape[static_cast<std::size_t>(d)]) +
                          " in the indices");
  }
  if (values.partial_op != ReduceOp::sum && values.layout.partial_count > 0)
    throw Error(op, context +
                        ": the values hold pending max/min partials; finish them with "
                        "reshard first");
  const ScatterLayouts rules = scatter_layouts(values.layout, indices.layout, label);
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  check_indices(idx, n, mesh, names, op, context);
  if (used_indices) *used_indices = idx;
  return scatter_local<T, I>(label, n, DimLayout{}, mesh, values, idx);
}

/// The gradient of take<label> with respect to the table: the cotangent `g` (the take result's
/// labels) scattered back along `label`, laid out as `vdim` (the table's layout of the label in
/// the lookup: split when every rank looked up its own vocabulary shard, so the gradient lands
/// in that shard and nothing of the table's size is replicated).
template <class T, class I>
RuntimeTensor<T> take_cotangent(char label, std::int64_t n, const DimLayout& vdim,
                                const RuntimeTensor<I>& idx, const RuntimeTensor<T>& g,
                                const MeshState& mesh) {
  return index_ops::scatter_local<T, I>(label, n, vdim, mesh, g, idx);
}

/// The gradient of scatter_add<label> with respect to the values: a take of the cotangent `g`
/// ("V M...") at the same indices (no range check: the forward pass checked them).
template <class T, class I>
RuntimeTensor<T> scatter_add_cotangent(char label, const RuntimeTensor<I>& idx,
                                       const RuntimeTensor<T>& g, const MeshState& mesh,
                                       const std::vector<std::string>& names) {
  return take_runtime<T, I>(label, mesh, names, g, idx, nullptr, nullptr, false);
}

}  // namespace detail
}  // namespace gshard
