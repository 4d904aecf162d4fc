#pragma once
// take_along and scatter_add_along (the batched pair of MoE dispatch and combine) on run-time
// layouts, and their cotangents.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../../kernels/gather.hpp"
#include "../../tensor/sharded.hpp"
#include "rules.hpp"
#include "take.hpp"

namespace gshard {
namespace detail {

namespace index_ops {

/// A GatherMap looping over `loop` (a local block), with the strides of the same labels in the
/// indices' block (a) and in `other` (b, the table or the scatter's result), and `label`'s
/// stride, offset and valid extent in `other`.
inline GatherMap along_map(const Layout& loop, const LocalDims& ll, const Layout& idx,
                           const LocalDims& li, const Layout& other, const LocalDims& lother,
                           char label) {
  GatherMap m;
  m.rank = loop.rank;
  for (int d = 0; d < m.rank; ++d) {
    m.extent[d] = ll.extent[d];
    m.valid[d] = ll.valid[d];
    const int id = idx.find(loop.dims[d].label);
    const int od = other.find(loop.dims[d].label);
    m.a_stride[d] = id >= 0 ? li.stride[id] : 0;
    m.b_stride[d] = od >= 0 ? lother.stride[od] : 0;
  }
  const int vd = other.find(label);
  m.v_stride = lother.stride[vd];
  m.v_offset = lother.offset[vd];
  m.v_valid = lother.valid[vd];
  return m;
}

/// The local half of scatter_add_along: `values` added into a zeroed result laid out as `out`
/// (labels: `label`, of size n, and values' labels; the values' axes on the shared labels), the
/// indices already in the values' splits. Each value row goes to its index (none if negative).
template <class T, class I>
RuntimeTensor<T> scatter_along_local(char label, std::int64_t n, const Layout& out,
                                     const MeshState& mesh, const RuntimeTensor<T>& values,
                                     const RuntimeTensor<I>& idx) {
  RuntimeTensor<T> r{out, {}, {}, ReduceOp::sum};
  for (int d = 0; d < out.rank; ++d)
    r.shape.push_back(
        out.dims[d].label == label
            ? n
            : values.shape[static_cast<std::size_t>(values.layout.find(out.dims[d].label))]);
  const LocalDims lo = local_dims(r.layout, r.shape, mesh);
  const LocalDims lv = local_dims(values.layout, values.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  const GatherMap m = along_map(values.layout, lv, idx.layout, li, r.layout, lo, label);
  r.data = Kokkos::View<T*>("gshard::scatter_add_along", static_cast<std::size_t>(lo.size));
  scatter_into<T, I>("gshard::scatter_add_along", m, lv.size, r.data, idx.data, values.data);
  return r;
}

}  // namespace index_ops

/// take_along `label` on run-time layouts: check the operands, bring them to the rule's layouts
/// (detail::take_along_layouts), check the indices (unless trusted), look up locally.
/// `used_indices` receives the indices in the layout the lookup used (kept for the backward);
/// `order`, when given, orders the result's dimensions like its labels (the backward's use).
template <class T, class I>
RuntimeTensor<T> take_along_runtime(char label, const MeshState& mesh,
                                    const std::vector<std::string>& names,
                                    const RuntimeTensor<T>& table, const RuntimeTensor<I>& indices,
                                    Bounds bounds = Bounds::checked,
                                    RuntimeTensor<I>* used_indices = nullptr,
                                    const Layout* order = nullptr) {
  using namespace index_ops;
  const std::string op = std::string("take_along<\"") + label + "\">";
  const std::string context = "table " + describe(table.layout, table.shape, names) + ", indices " +
                              describe(indices.layout, indices.shape, names);
  const int vd = table.layout.find(label);
  if (vd < 0) throw Error(op, context + ": the table has no label '" + label + "'");
  if (indices.layout.find(label) >= 0)
    throw Error(op, context + ": label '" + label + "' is also a label of the indices");
  for (int d = 0; d < indices.layout.rank; ++d) {
    const char c = indices.layout.dims[d].label;
    const int td = table.layout.find(c);
    if (td >= 0 &&
        table.shape[static_cast<std::size_t>(td)] != indices.shape[static_cast<std::size_t>(d)])
      throw Error(
          op, context + ": batch label '" + c + "' has size " +
                  std::to_string(table.shape[static_cast<std::size_t>(td)]) + " in the table but " +
                  std::to_string(indices.shape[static_cast<std::size_t>(d)]) + " in the indices");
  }
  const AlongLayouts rules = take_along_layouts(table.layout, indices.layout, label);
  if (!rules.ok) throw Error(op, context + ": the result would have more than 8 labels");
  const std::int64_t n = table.shape[static_cast<std::size_t>(vd)];
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  if (bounds == Bounds::checked) check_indices(idx, n, mesh, names, op, context, true);
  if (used_indices) *used_indices = idx;
  const RuntimeTensor<T> tab = bring(table, rules.data, mesh, names, op);
  if (tab.partial_op != ReduceOp::sum && rules.output.partial_count > 0)
    throw Error(op, context +
                        ": the table holds pending max/min partials; finish them with "
                        "reshard first");
  RuntimeTensor<T> out{rules.output, idx.shape, {}, ReduceOp::sum};
  for (int d = 0; d < tab.layout.rank; ++d)
    if (d != vd && idx.layout.find(tab.layout.dims[d].label) < 0)
      out.shape.push_back(tab.shape[static_cast<std::size_t>(d)]);
  if (order) {
    const Layout l = reordered_like(out.layout, *order);
    out.shape = shape_in(l, out.layout, out.shape);
    out.layout = l;
  }
  const LocalDims lo = local_dims(out.layout, out.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  const LocalDims lt = local_dims(tab.layout, tab.shape, mesh);
  const GatherMap m = along_map(out.layout, lo, idx.layout, li, tab.layout, lt, label);
  out.data = gather<T, I>("gshard::take_along", m, lo.size, idx.data, tab.data);
  return out;
}

/// scatter_add_along `label` (size n) with batch labels `batch` on run-time layouts: check the
/// operands, bring the indices to the values' splits, check them (unless trusted), add locally.
template <class T, class I>
RuntimeTensor<T> scatter_add_along_runtime(char label, std::string_view batch, std::int64_t n,
                                           const MeshState& mesh,
                                           const std::vector<std::string>& names,
                                           const RuntimeTensor<T>& values,
                                           const RuntimeTensor<I>& indices,
                                           Bounds bounds = Bounds::checked,
                                           RuntimeTensor<I>* used_indices = nullptr) {
  using namespace index_ops;
  const std::string op =
      std::string("scatter_add_along<\"") + label + "\", \"" + std::string(batch) + "\">";
  const std::string context = "values " + describe(values.layout, values.shape, names) +
                              ", indices " + describe(indices.layout, indices.shape, names) +
                              ", size " + std::to_string(n);
  if (n < 0) throw Error(op, context + ": the size must not be negative");
  if (values.layout.find(label) >= 0)
    throw Error(op, context + ": the values already have label '" + label + "'");
  for (int d = 0; d < indices.layout.rank; ++d) {
    const char c = indices.layout.dims[d].label;
    const int vd = values.layout.find(c);
    if (vd < 0) throw Error(op, context + ": index label '" + c + "' is not a label of the values");
    if (values.shape[static_cast<std::size_t>(vd)] != indices.shape[static_cast<std::size_t>(d)])
      throw Error(op, context + ": label '" + c + "' has size " +
                          std::to_string(values.shape[static_cast<std::size_t>(vd)]) +
                          " in the values but " +
                          std::to_string(indices.shape[static_cast<std::size_t>(d)]) +
                          " in the indices");
  }
  for (const char c : batch)
    if (c != ' ' && indices.layout.find(c) < 0)
      throw Error(op, context + ": batch label '" + c + "' is not a label of the indices");
  if (values.partial_op != ReduceOp::sum && values.layout.partial_count > 0)
    throw Error(op, context +
                        ": the values hold pending max/min partials; finish them with "
                        "reshard first");
  const AlongLayouts rules = scatter_along_layouts(values.layout, indices.layout, label, batch);
  if (!rules.ok) throw Error(op, context + ": the result would have more than 8 labels");
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  if (bounds == Bounds::checked) check_indices(idx, n, mesh, names, op, context, true);
  if (used_indices) *used_indices = idx;
  return scatter_along_local<T, I>(label, n, rules.output, mesh, values, idx);
}

/// The gradient of take_along<label> with respect to the table (labels and order of `table`):
/// the cotangent `g` (the result's layout) scattered back at the indices the lookup used, the
/// batch labels in g's splits; pending over g's axes of the indices' other labels. Local.
template <class T, class I>
RuntimeTensor<T> take_along_cotangent(char label, std::int64_t n, const Layout& table,
                                      const RuntimeTensor<I>& idx, const RuntimeTensor<T>& g,
                                      const MeshState& mesh) {
  std::string labels;
  for (int d = 0; d < table.rank; ++d) labels += table.dims[d].label;
  const Layout out = scatter_along_layouts(g.layout, idx.layout, label, labels).output;
  return index_ops::scatter_along_local<T, I>(label, n, reordered_like(out, table), mesh, g, idx);
}

/// The gradient of scatter_add_along<label> with respect to the values (labels and order of
/// `values`): a take_along of the cotangent `g` at the same indices (already checked).
template <class T, class I>
RuntimeTensor<T> scatter_add_along_cotangent(char label, const Layout& values,
                                             const RuntimeTensor<I>& idx, const RuntimeTensor<T>& g,
                                             const MeshState& mesh,
                                             const std::vector<std::string>& names) {
  return take_along_runtime<T, I>(label, mesh, names, g, idx, Bounds::trusted, nullptr, &values);
}

}  // namespace detail
}  // namespace gshard
