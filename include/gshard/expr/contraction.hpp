#pragma once
// The run-time einsum engine (operands brought to the rules' layouts, local blocks contracted),
// and the two shapes of data movement that autodiff needs from it: summing a tensor down to a
// subset of its labels, and broadcasting one up to more labels. ops/einsum.hpp builds the typed
// einsum on it; the backward passes of einsum and of fused elementwise trees use all three.
#include <string>
#include <string_view>
#include <vector>

#include "../core/einsum.hpp"
#include "../kernels/contract.hpp"
#include "../kernels/elementwise.hpp"
#include "../spmd/reshard.hpp"
#include "node.hpp"

namespace gshard::detail {

inline LocalBlock local_block(const Layout& l, const Shape& shape,
                              const std::array<int, max_axes>& sizes) {
  LocalBlock b;
  for (int d = 0; d < l.rank; ++d) b.labels += l.dims[d].label;
  const Shape e = local_extents(l, shape, sizes);
  b.extents.assign(e.begin(), e.end());
  return b;
}

/// The whole sharded einsum on run-time layouts: bring each operand to the layout the rules give
/// it, contract the local blocks. The typed einsum below and the property tests both run this.
template <class T>
RuntimeTensor<T> einsum_runtime(std::string_view text, const EinsumSpec& spec,
                                const MeshState& mesh, const std::vector<std::string>& axis_names,
                                const RuntimeTensor<T>& a, const RuntimeTensor<T>* b,
                                const EinsumLayouts* fixed = nullptr) {
  const bool binary = b != nullptr;
  // `fixed`: the rules the caller already applied at compile time (operands brought there).
  const EinsumLayouts rules =
      fixed ? *fixed : infer_einsum(spec, a.layout, binary ? b->layout : Layout{});
  auto size_of = [&](char c) -> std::int64_t {
    const int da = a.layout.find(c);
    const int db = binary ? b->layout.find(c) : -1;
    if (da >= 0 && db >= 0 &&
        a.shape[static_cast<std::size_t>(da)] != b->shape[static_cast<std::size_t>(db)])
      throw Error("einsum", "\"" + std::string(text) + "\": label '" + std::string(1, c) +
                                "' has size " +
                                std::to_string(a.shape[static_cast<std::size_t>(da)]) +
                                " in the first operand (global shape " + shape_string(a.shape) +
                                ") but " + std::to_string(b->shape[static_cast<std::size_t>(db)]) +
                                " in the second (global shape " + shape_string(b->shape) + ")");
    return da >= 0 ? a.shape[static_cast<std::size_t>(da)] : b->shape[static_cast<std::size_t>(db)];
  };
  for (char c : spec.operands[0]) (void)size_of(c);  // every shared label must agree
  auto bring = [&](const RuntimeTensor<T>& t, const Layout& need) {
    // Einsum is linear in sums only: pending max/min copies must not stay pending.
    if (t.partial_op != ReduceOp::sum && need.partial_count > 0)
      throw Error("einsum", "\"" + std::string(text) +
                                "\": an operand holds pending max/min partials; finish them with "
                                "reshard first");
    return reshard_runtime(t, need, mesh, axis_names);
  };
  const RuntimeTensor<T> an = bring(a, rules.operands[0]);
  RuntimeTensor<T> out{rules.output, {}, {}, ReduceOp::sum};
  for (char c : spec.output) out.shape.push_back(size_of(c));
  const LocalBlock lo = local_block(out.layout, out.shape, mesh.sizes);
  // contract() writes every element, padding included (zeros): no fill needed.
  out.data = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::einsum"), Kokkos::WithoutInitializing), lo.size());
  if (!binary) {
    contract<T>(an.data.data(), local_block(an.layout, an.shape, mesh.sizes), nullptr, {},
                out.data.data(), lo);
  } else {
    const RuntimeTensor<T> bn = bring(*b, rules.operands[1]);
    contract<T>(an.data.data(), local_block(an.layout, an.shape, mesh.sizes), bn.data.data(),
                local_block(bn.layout, bn.shape, mesh.sizes), out.data.data(), lo);
  }
  return out;
}

/// `t` in layout `need` (the same labels) through the reshard engine; sum partials only.
template <class T>
RuntimeTensor<T> bring_sum(const RuntimeTensor<T>& t, const Layout& need, const MeshState& mesh,
                           const std::vector<std::string>& axis_names) {
  if (t.layout == need) return t;
  RuntimeTensor<T> s = t;
  s.partial_op = ReduceOp::sum;
  return reshard_runtime(s, need, mesh, axis_names);
}

/// `g` broadcast along the labels of `target` it lacks, in target's dimensions (order and
/// splits); g's pending partial axes stay pending where target does not split them. No
/// communication unless g's own splits or partials differ from target's.
template <class T>
RuntimeTensor<T> broadcast_runtime(const RuntimeTensor<T>& g, const Layout& target,
                                   const Shape& target_shape, const MeshState& mesh,
                                   const std::vector<std::string>& axis_names) {
  Layout from = g.layout;  // g's labels, split as target splits them
  from.partial_count = 0;
  for (int d = 0; d < from.rank; ++d) {
    DimLayout nd = target.dims[target.find(from.dims[d].label)];
    from.dims[d] = nd;
  }
  Layout out_layout = finished_layout(target);
  for (int i = 0; i < g.layout.partial_count; ++i) {
    const int a = g.layout.partial[i];
    if (target.dim_on_axis(a) >= 0) continue;
    from.partial[from.partial_count++] = a;
    out_layout.partial[out_layout.partial_count++] = a;
  }
  const RuntimeTensor<T> src = bring_sum(g, from, mesh, axis_names);
  const Shape ext = local_extents(out_layout, target_shape, mesh.sizes);
  const Shape src_ext = local_extents(src.layout, src.shape, mesh.sizes);
  FusedBlock block;
  block.rank = out_layout.rank;
  for (int d = 0; d < out_layout.rank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    block.extent[d] = ext[du];
    block.valid[d] = block_of(out_layout.dims[d], target_shape[du], mesh.sizes, mesh.coords).valid;
  }
  LeafEval<T> e;
  e.data = src.data.data();
  e.rank = out_layout.rank;
  std::int64_t stride = 1;
  for (int d = src.layout.rank - 1; d >= 0; --d) {
    e.stride[out_layout.find(src.layout.dims[d].label)] = stride;
    stride *= src_ext[static_cast<std::size_t>(d)];
  }
  Kokkos::View<T*> out(
      Kokkos::view_alloc(std::string("gshard::broadcast"), Kokkos::WithoutInitializing),
      product(ext));
  run_fused(e, out.data(), block);
  return RuntimeTensor<T>(out_layout, target_shape, out, ReduceOp::sum);
}

/// `g` summed over the labels that `target` lacks and ordered as target (splits of the kept
/// labels stay; summing a split label leaves a partial sum). Converted to double or float.
template <class T>
AnyTensor reduce_to_labels(const RuntimeTensor<T>& g, const Layout& target, const MeshState& mesh,
                           const std::vector<std::string>& axis_names, bool to_double) {
  RuntimeTensor<T> r = g;
  std::string from, to;
  for (int d = 0; d < g.layout.rank; ++d) from += g.layout.dims[d].label;
  for (int d = 0; d < target.rank; ++d) to += target.dims[d].label;
  if (from != to) {
    const std::string text = from + "->" + to;
    const EinsumParse p = parse_einsum(text);
    r = einsum_runtime<T>(text, p.spec, mesh, axis_names, g, nullptr);
  }
  if (to_double) {
    if constexpr (std::is_same_v<T, double>)
      return r;
    else
      return converted<double>(r);
  } else {
    if constexpr (std::is_same_v<T, float>)
      return r;
    else
      return converted<float>(r);
  }
}

/// The cotangent of einsum operand `which` (labels `mine`, its value's layout and shape) from the
/// result's cotangent `g` (labels `out`) and the other operand (null for a unary einsum):
/// contract g with the other operand over the labels the operand lacks, then broadcast along the
/// labels the forward pass summed away.
template <class T>
RuntimeTensor<T> einsum_operand_cotangent(std::string_view out, std::string_view mine,
                                          const Layout& mine_layout, const Shape& mine_shape,
                                          const RuntimeTensor<T>& g, std::string_view other,
                                          const RuntimeTensor<T>* other_value,
                                          const MeshState& mesh,
                                          const std::vector<std::string>& axis_names) {
  if (!other_value) return broadcast_runtime(g, mine_layout, mine_shape, mesh, axis_names);
  std::string kept;
  for (char c : mine)
    if (out.find(c) != std::string_view::npos || other.find(c) != std::string_view::npos) kept += c;
  const std::string text = std::string(out) + "," + std::string(other) + "->" + kept;
  const EinsumParse p = parse_einsum(text);
  if (p.error != EinsumError::none)
    throw Error("grad", "internal: einsum backward \"" + text + "\" does not parse");
  const RuntimeTensor<T> c = einsum_runtime<T>(text, p.spec, mesh, axis_names, g, other_value);
  if (kept.size() == mine.size() && kept == std::string(mine)) return c;
  return broadcast_runtime(c, mine_layout, mine_shape, mesh, axis_names);
}

}  // namespace gshard::detail
