#pragma once
// The run-time einsum engine (operands brought to the rules' layouts, local blocks contracted),
// and the two shapes of data movement that autodiff needs from it: summing a tensor down to a
// subset of its labels, and broadcasting one up to more labels. ops/einsum.hpp builds the typed
// einsum on it; the backward passes of einsum and of fused elementwise trees use all three.
#include <map>
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

/// The cost-model choice of a binary einsum's plan (ops/einsum.hpp): which operand stays, which
/// moves, where the contraction's own output lands before it is brought to the rules' layout.
struct EinsumChoice {
  EinsumLayouts compute;         // operands as contracted, and the contraction's output layout
  std::int64_t bytes = 0;        // bytes rank 0 sends: both operands' reshards and the output's
  std::int64_t rules_bytes = 0;  // the same for the rules' plan
  int candidates = 1;
  bool by_rules = true;  // compute is the rules' plan
};

namespace einsum_planner {

constexpr std::int64_t step_cost_bytes = 32 << 10;  // a collective's start-up, as bytes

inline bool same_layout(const Layout& x, const Layout& y) {
  if (x.rank != y.rank || partial_mask(x) != partial_mask(y)) return false;
  for (int d = 0; d < x.rank; ++d)
    if (x.dims[d].label != y.dims[d].label || !same_axes(x.dims[d], y.dims[d])) return false;
  return true;
}

struct Cost {
  std::int64_t bytes = 0;  // sent by rank 0 of the mesh: every rank computes the same choice
  std::int64_t model = 0;  // bytes plus a start-up per collective: equal volumes keep fewer steps
  Cost& operator+=(const Cost& c) {
    bytes += c.bytes;
    model += c.model;
    return *this;
  }
};

inline Cost reshard_cost(const Layout& from, const Layout& to, const Shape& shape,
                         const std::array<int, max_axes>& sizes,
                         const std::vector<std::string>& names, std::int64_t element) {
  Cost c;
  if (same_layout(from, to)) return c;
  for (const auto& s : plan_reshard(from, to, shape, sizes, Coords{}, names, element).steps) {
    c.bytes += s.bytes;
    c.model += s.bytes + (s.axes != 0 ? step_cost_bytes : 0);
  }
  return c;
}

}  // namespace einsum_planner

/// Chooses the layouts a binary einsum contracts in: each label split over the axes it has in
/// either operand, in the rules' result, or none (axes disjoint), keeping only plans that do no
/// more local multiply-adds than the rules' plan; the one whose reshards (both operands to their
/// contraction layouts, then the contraction's output to the rules' result layout) send the
/// fewest bytes wins, the rules' plan on ties. Operands with pending partial sums, or more than
/// 4096 candidates, keep the rules' plan. Uncached: see choose_einsum_layouts.
inline EinsumChoice plan_einsum_layouts(const EinsumSpec& spec, const EinsumLayouts& rules,
                                        const Layout& a, const Shape& a_shape, const Layout& b,
                                        const Shape& b_shape,
                                        const std::array<int, max_axes>& sizes,
                                        const std::vector<std::string>& names,
                                        std::int64_t element) {
  using einsum_planner::reshard_cost;
  using einsum_planner::same_layout;
  EinsumChoice best;
  best.compute = rules;
  std::string labels;  // every label once, with its global size
  std::vector<std::int64_t> extent;
  auto note = [&](const Layout& l, const Shape& s) {
    for (int d = 0; d < l.rank; ++d)
      if (labels.find(l.dims[d].label) == std::string::npos) {
        labels += l.dims[d].label;
        extent.push_back(s[static_cast<std::size_t>(d)]);
      }
  };
  note(a, a_shape);
  note(b, b_shape);
  Shape out_shape;
  for (char c : spec.output) out_shape.push_back(extent[labels.find(c)]);
  auto split_of = [](const Layout& l, char c) {
    const int d = l.find(c);
    return d < 0 ? DimLayout{} : l.dims[d];
  };
  // A plan: one split per label. Its layouts, its local multiply-adds, its cost.
  auto layouts_of = [&](const std::vector<DimLayout>& split) {
    EinsumLayouts r = rules;
    for (int w = 0; w < 2; ++w) {
      Layout& l = r.operands[static_cast<std::size_t>(w)];
      l.partial_count = 0;
      for (int d = 0; d < l.rank; ++d) l.dims[d] = split[labels.find(l.dims[d].label)];
    }
    Layout& o = r.output;
    o.partial_count = 0;
    o.partial = {};
    for (int d = 0; d < o.rank; ++d) o.dims[d] = split[labels.find(o.dims[d].label)];
    for (std::size_t i = 0; i < labels.size(); ++i)
      if (spec.output.find(labels[i]) == std::string_view::npos)
        for (int x = 0; x < split[i].axis_count; ++x)
          o.partial[o.partial_count++] = split[i].axes[x];
    // The source layouts where nothing changes, so that materialising them moves nothing.
    if (same_layout(r.operands[0], a)) r.operands[0] = a;
    if (same_layout(r.operands[1], b)) r.operands[1] = b;
    return r;
  };
  auto work = [&](const std::vector<DimLayout>& split) {
    double w = 1;
    for (std::size_t i = 0; i < labels.size(); ++i)
      w *= static_cast<double>(ceil_div(extent[i], shard_count(split[i], sizes)));
    return w;
  };
  auto cost = [&](const EinsumLayouts& r) {
    einsum_planner::Cost c = reshard_cost(a, r.operands[0], a_shape, sizes, names, element);
    c += reshard_cost(b, r.operands[1], b_shape, sizes, names, element);
    c += reshard_cost(r.output, rules.output, out_shape, sizes, names, element);
    return c;
  };
  einsum_planner::Cost least = cost(rules);
  best.rules_bytes = best.bytes = least.bytes;
  if (a.partial_count > 0 || b.partial_count > 0 || least.model == 0) return best;

  std::vector<std::vector<DimLayout>> options(labels.size());
  std::size_t count = 1;
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const char c = labels[i];
    for (const DimLayout& d : {split_of(rules.operands[0], c), split_of(rules.operands[1], c),
                               split_of(a, c), split_of(b, c), DimLayout{}}) {
      DimLayout n{};
      n.label = c;
      n.axis_count = d.axis_count;
      for (int x = 0; x < d.axis_count; ++x) n.axes[x] = d.axes[x];
      bool seen = false;
      for (const auto& o : options[i]) seen = seen || same_axes(o, n);
      if (!seen) options[i].push_back(n);
    }
    count *= options[i].size();
  }
  if (count > 4096) return best;
  std::vector<DimLayout> rules_split(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    const char c = labels[i];
    const DimLayout d =
        a.find(c) >= 0 ? split_of(rules.operands[0], c) : split_of(rules.operands[1], c);
    rules_split[i] = options[i][0];
    for (const auto& o : options[i])
      if (same_axes(o, d)) rules_split[i] = o;
  }
  const double max_work = work(rules_split);
  best.candidates = 0;
  std::vector<DimLayout> split(labels.size());
  auto visit = [&](auto&& self, std::size_t i, unsigned taken) -> void {
    if (i == labels.size()) {
      ++best.candidates;
      if (work(split) > max_work) return;
      const EinsumLayouts r = layouts_of(split);
      const einsum_planner::Cost c = cost(r);
      if (c.model < least.model) {
        least = c;
        best.bytes = c.bytes;
        best.compute = r;
        best.by_rules = false;
      }
      return;
    }
    for (const auto& o : options[i]) {
      const unsigned m = axes_of(o);
      if (m & taken) continue;
      split[i] = o;
      self(self, i + 1, taken | m);
    }
  };
  visit(visit, 0, 0u);
  return best;
}

namespace einsum_planner {

inline void append_layout(std::string& key, const Layout& l) {
  key += static_cast<char>('0' + l.rank);
  for (int d = 0; d < l.rank; ++d) {
    key += l.dims[d].label;
    for (int i = 0; i < l.dims[d].axis_count; ++i)
      key += static_cast<char>('0' + l.dims[d].axes[i]);
    key += ',';
  }
  for (int i = 0; i < l.partial_count; ++i) key += static_cast<char>('a' + l.partial[i]);
  key += ';';
}

}  // namespace einsum_planner

/// plan_einsum_layouts, remembered: a training loop or a solver evaluates the same einsum on the
/// same shapes every step, and costing its plans takes microseconds per candidate.
inline EinsumChoice choose_einsum_layouts(const EinsumSpec& spec, const EinsumLayouts& rules,
                                          const Layout& a, const Shape& a_shape, const Layout& b,
                                          const Shape& b_shape,
                                          const std::array<int, max_axes>& sizes,
                                          const std::vector<std::string>& names,
                                          std::int64_t element) {
  std::string key;
  key.append(spec.operands[0]).append(",").append(spec.operands[1]).append("->");
  key.append(spec.output).append(";");
  einsum_planner::append_layout(key, a);
  einsum_planner::append_layout(key, b);
  einsum_planner::append_layout(key, rules.output);
  for (const Shape* shape : {&a_shape, &b_shape})
    for (const std::int64_t n : *shape) key.append(std::to_string(n)).append(",");
  for (std::size_t i = 0; i < names.size(); ++i) key.append(std::to_string(sizes[i])).append("x");
  key.append(std::to_string(element));
  thread_local std::map<std::string, EinsumChoice> cache;
  if (const auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() >= 4096) cache.clear();  // bounded: shapes that vary without end
  return cache
      .emplace(key, plan_einsum_layouts(spec, rules, a, a_shape, b, b_shape, sizes, names, element))
      .first->second;
}

/// The whole sharded einsum on run-time layouts: bring each operand to the layout its plan gives
/// it, contract the local blocks. The typed einsum below and the property tests both run this.
template <class T>
RuntimeTensor<T> einsum_runtime(std::string_view text, const EinsumSpec& spec,
                                const MeshState& mesh, const std::vector<std::string>& axis_names,
                                const RuntimeTensor<T>& a, const RuntimeTensor<T>* b,
                                const EinsumLayouts* fixed = nullptr) {
  const bool binary = b != nullptr;
  // `fixed`: the layouts the caller chose (operands brought there, result left in its output
  // layout). Otherwise the rules' result layout, reached by the cost model's plan.
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
  if (!fixed && binary) {
    const EinsumChoice choice =
        choose_einsum_layouts(spec, rules, a.layout, a.shape, b->layout, b->shape, mesh.sizes,
                              axis_names, static_cast<std::int64_t>(sizeof(T)));
    if (!choice.by_rules)
      return reshard_runtime(einsum_runtime(text, spec, mesh, axis_names, a, b, &choice.compute),
                             rules.output, mesh, axis_names);
  }
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
  // contract() writes every element, padding included (zeros): no fill needed, and a dropped
  // result of the same size can be reused.
  out.data = recycled_result<T>(lo.size(), "gshard::einsum");
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
