#pragma once
// The backward driver: gshard::track marks parameters, gshard::grad(loss, std::tie(params...))
// walks the recorded graph from the loss in reverse creation order and returns one gradient per
// parameter, in the parameter's own layout type.
//
// Cotangents flow in whatever layout the backward of each op produced them; before a node's
// backward runs, its accumulated cotangent is brought to the node's layout by the reshard
// engine. That one step is every collective's backward: a cotangent split where the value was
// replicated is all-gathered, one that is partial where the value is split is reduce-scattered,
// one for a value with pending partial sums is the same on every copy (broadcast, no data
// moves). A cotangent that is partial over an axis the value does not use stays partial, so the
// gradient of a replicated weight used with data-split activations is reduced once, at the end.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "../expr/node.hpp"
#include "../tensor/graph.hpp"

namespace gshard {

namespace autodiff_error {
template <class>
inline constexpr bool always_false = false;
template <auto Op, class Parameter>
struct parameter_must_be_a_float_or_double_tensor {
  static_assert(always_false<parameter_must_be_a_float_or_double_tensor>,
                "gshard autodiff: parameters are Sharded tensors of float or double (the call, "
                "the type given)");
};
template <auto Op, class... None>  // None: empty, keeps the instantiation dependent
struct no_parameters {
  static_assert(always_false<no_parameters>,
                "gshard autodiff: name the tensors to differentiate (or the block's inputs)");
};
template <auto LossSpec, class Element>
struct loss_must_be_floating_point {
  static_assert(always_false<loss_must_be_floating_point>,
                "gshard::grad: the loss must hold float or double (its spec, its element type)");
};
template <class Input>
struct checkpoint_input_must_be_a_tensor {
  static_assert(always_false<checkpoint_input_must_be_a_tensor>,
                "gshard::checkpoint: the block's inputs are Sharded tensors (the type given)");
};
template <class Returned>
struct checkpoint_block_must_return_one_tensor {
  static_assert(always_false<checkpoint_block_must_return_one_tensor>,
                "gshard::checkpoint: the block must return one tensor or expression (what it "
                "returned)");
};
}  // namespace autodiff_error

namespace detail {
template <class P>
constexpr bool trackable_v = false;
template <class T, class MeshT, fixed_string Spec>
constexpr bool trackable_v<Sharded<T, MeshT, Spec>> = differentiable_v<T>;

/// True when every P is a float/double Sharded and there is at least one; otherwise the named
/// diagnostic for the first that is not.
template <fixed_string Op, class... P>
constexpr bool check_parameters() {
  if constexpr (sizeof...(P) == 0) {
    return sizeof(autodiff_error::no_parameters<shown<Op>>) == 0;
  } else {
    return ([] {
      if constexpr (trackable_v<std::remove_cvref_t<P>>)
        return true;
      else
        return sizeof(autodiff_error::parameter_must_be_a_float_or_double_tensor<
                      shown<Op>, std::remove_cvref_t<P>>) == 0;
    }() && ...);
  }
}
}  // namespace detail

namespace detail {

/// The layout a node's cotangent is brought to: the node's dimensions, with the cotangent's
/// pending partial axes that the node neither splits nor holds partials on.
inline Layout cotangent_layout(const GradNode& n, const Layout& g) {
  Layout l = finished_layout(n.layout);
  for (int i = 0; i < g.partial_count; ++i) {
    const int a = g.partial[i];
    if (n.layout.is_partial(a) || n.layout.dim_on_axis(a) >= 0) continue;
    l.partial[l.partial_count++] = a;
  }
  return l;
}

inline std::string node_text(const GradNode& n) {
  std::string s = n.op;
  if (n.where.line() != 0) s += " at " + where_string(n.where);
  s += " (";
  s += quoted_layout(n.layout, n.axis_names);
  s += ", global shape ";
  s += shape_string(n.shape);
  s += ')';
  return s;
}

/// `g` brought to `need` (the same labels) with the reshard engine.
template <class T>
RuntimeTensor<T> bring_cotangent(const RuntimeTensor<T>& g, const Layout& need, const GradNode& n) {
  if (g.layout == need) return g;
  if (!same_label_set(g.layout, need))
    throw Error("grad", "internal: a cotangent with layout \"" +
                            layout_text(g.layout, n.axis_names) + "\" reached " + node_text(n));
  RuntimeTensor<T> s = g;
  s.partial_op = ReduceOp::sum;
  return reshard_runtime(s, need, *n.mesh, n.axis_names);
}

template <class T>
RuntimeTensor<T> add_cotangents(const RuntimeTensor<T>& a, const RuntimeTensor<T>& b) {
  Kokkos::View<T*> out(
      Kokkos::view_alloc(std::string("gshard::cotangent_sum"), Kokkos::WithoutInitializing),
      a.data.extent(0));
  const Kokkos::View<T*> x = a.data;
  const Kokkos::View<T*> y = b.data;
  Kokkos::parallel_for(
      "gshard::cotangent_sum", Kokkos::RangePolicy<>(0, x.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { out(i) = x(i) + y(i); });
  return RuntimeTensor<T>(a.layout, a.shape, out, ReduceOp::sum);
}

/// `g` in element type T, checked against the node (labels and global shape), not yet moved.
template <class T>
RuntimeTensor<T> checked_cotangent(const AnyTensor& g, const GradNode& n) {
  RuntimeTensor<T> t = cotangent_as<T>(g);
  t.grad = nullptr;
  if (!same_label_set(t.layout, n.layout))
    throw Error("grad", "internal: a cotangent with layout \"" +
                            layout_text(t.layout, n.axis_names) + "\" reached " + node_text(n));
  if (t.shape != shape_in(t.layout, n.layout, n.shape))
    throw Error("grad", "internal: a cotangent of global shape " + shape_string(t.shape) +
                            " reached " + node_text(n));
  return t;
}

/// Adds `g` into the cotangent accumulated for node `n` (both brought to a common layout: the
/// node's, with the partial axes both still hold).
template <class T>
AnyTensor accumulate(const std::optional<AnyTensor>& acc, const RuntimeTensor<T>& g,
                     const GradNode& n) {
  RuntimeTensor<T> b = bring_cotangent(g, cotangent_layout(n, g.layout), n);
  if (!acc) return b;
  RuntimeTensor<T> a = std::get<RuntimeTensor<T>>(*acc);
  if (!(a.layout == b.layout)) {
    Layout common = finished_layout(n.layout);
    for (int i = 0; i < a.layout.partial_count; ++i)
      if (b.layout.is_partial(a.layout.partial[i]))
        common.partial[common.partial_count++] = a.layout.partial[i];
    a = bring_cotangent(a, common, n);
    b = bring_cotangent(b, common, n);
  }
  return add_cotangents(a, b);
}

/// The node's cotangent from the contributions its consumers returned. Contributions in the same
/// layout are added where they are first, so each layout is brought to the node once (a value
/// read twice through an AllToAll gets one reverse AllToAll, not two).
template <class T>
AnyTensor combine(const std::vector<AnyTensor>& parts, const GradNode& n) {
  std::vector<RuntimeTensor<T>> groups;
  for (const AnyTensor& p : parts) {
    RuntimeTensor<T> t = checked_cotangent<T>(p, n);
    auto same = std::find_if(groups.begin(), groups.end(),
                             [&](const RuntimeTensor<T>& q) { return q.layout == t.layout; });
    if (same == groups.end())
      groups.push_back(std::move(t));
    else
      *same = add_cotangents(*same, t);
  }
  std::optional<AnyTensor> acc;
  for (const RuntimeTensor<T>& t : groups) acc = accumulate<T>(acc, t, n);
  return *acc;
}

inline AnyTensor combine_any(const std::vector<AnyTensor>& parts, const GradNode& n) {
  return n.is_double ? combine<double>(parts, n) : combine<float>(parts, n);
}

/// Runs the backward pass from `root` (whose cotangent is `seed`) and returns the cotangent of
/// each target node (none: the root does not depend on it). Every node visited has its backward
/// closure dropped as soon as it ran, which frees the values it saved: the graph is used once.
/// A graph rebuilt by gshard::checkpoint passes `floor`, the first sequence number of its nodes:
/// reaching an older node that is not a target means the block used a tracked tensor it was
/// not given.
inline std::vector<std::optional<AnyTensor>> backprop(const std::shared_ptr<GradNode>& root,
                                                      const AnyTensor& seed,
                                                      const std::vector<GradNode*>& targets,
                                                      std::uint64_t floor = 0) {
  NoGrad off;  // the backward pass itself records nothing
  // Nodes reachable from the root, and whether each leads to a target.
  std::unordered_map<GradNode*, bool> leads;
  std::unordered_set<GradNode*> target_set(targets.begin(), targets.end());
  std::vector<GradNode*> order;
  {
    std::vector<std::pair<GradNode*, std::size_t>> stack{{root.get(), 0}};
    std::unordered_set<GradNode*> seen{root.get()};
    while (!stack.empty()) {
      auto& [node, next] = stack.back();
      if (next < node->inputs.size()) {
        GradNode* in = node->inputs[next++].get();
        if (in && in->sequence < floor && !target_set.count(in))
          throw Error("checkpoint",
                      "the block uses " + node_text(*in) +
                          ", a tracked tensor it was not given as an input: pass every tracked "
                          "tensor the block reads to gshard::checkpoint after the function");
        if (in && seen.insert(in).second) stack.push_back({in, 0});
        continue;
      }
      bool l = target_set.count(node) > 0;
      for (const auto& in : node->inputs)
        if (in && leads[in.get()]) l = true;
      leads[node] = l;
      order.push_back(node);
      stack.pop_back();
    }
  }
  std::sort(order.begin(), order.end(),
            [](const GradNode* a, const GradNode* b) { return a->sequence > b->sequence; });
  // The contributions each node's consumers returned so far, combined when the node runs.
  std::unordered_map<GradNode*, std::vector<AnyTensor>> cot;
  cot[root.get()].push_back(seed);
  for (GradNode* n : order) {
    if (target_set.count(n)) continue;  // kept for the caller
    auto it = cot.find(n);
    if (it == cot.end() || !leads[n]) {
      if (it != cot.end()) cot.erase(it);
      continue;
    }
    if (n->released)
      throw Error("grad", "the graph through " + node_text(*n) +
                              " was already used by an earlier grad(); run the forward pass again "
                              "(or use gshard::grad once per forward)");
    if (!n->backward) {
      cot.erase(it);  // an untracked leaf
      continue;
    }
    const UserSite site(n->site.file, n->site.line);  // errors and traces name the forward line
    const TraceOp op(n->op.c_str(), n->where.file_name(), n->where.line(), "grad of ");
    const AnyTensor g = combine_any(it->second, *n);
    cot.erase(it);
    const Cotangents outs = n->backward(g);
    if (outs.size() != n->inputs.size())
      throw Error("grad", "internal: the backward of " + node_text(*n) + " returned " +
                              std::to_string(outs.size()) + " cotangents for " +
                              std::to_string(n->inputs.size()) + " inputs");
    for (std::size_t i = 0; i < outs.size(); ++i) {
      GradNode* in = n->inputs[i].get();
      if (!in || !outs[i] || !leads[in]) continue;
      cot[in].push_back(*outs[i]);
    }
    // Free what this node saved for the backward pass, now that it ran.
    n->backward = nullptr;
    n->released = true;
  }
  std::vector<std::optional<AnyTensor>> result;
  for (GradNode* t : targets) {
    auto it = cot.find(t);
    if (it == cot.end())
      result.emplace_back(std::nullopt);
    else
      result.emplace_back(combine_any(it->second, *t));
  }
  return result;
}

/// The seed of a backward pass: ones in the loss's layout without partials.
template <class L>
AnyTensor seed_of(const L& loss) {
  using T = typename L::value_type;
  const Layout l = finished_layout(L::layout);
  Kokkos::View<T*> ones("gshard::grad_seed", static_cast<std::size_t>(loss.local_size()));
  Kokkos::deep_copy(ones, T(1));
  return RuntimeTensor<T>(l, loss.shape(), ones, ReduceOp::sum);
}

/// The gradient of one parameter from its accumulated cotangent: brought to the parameter's own
/// layout (finishing pending partial sums: the one reduction of data parallelism), or zeros.
template <class P>
P gradient_of(const P& p, const std::optional<AnyTensor>& g) {
  using T = typename P::value_type;
  if (!g) return P(p.mesh(), p.shape());
  const RuntimeTensor<T> t = cotangent_as<T>(*g);
  RuntimeTensor<T> r = bring_cotangent(t, P::layout, *p.grad_node());
  return P(p.mesh(), p.shape(), r.data);
}

}  // namespace detail

namespace detail {

/// Makes `p` a parameter: a fresh leaf node, created at the user's line `where`.
template <class P>
void track_one(P& p, std::source_location where) {
  static_assert(check_parameters<"track", P>());
  auto n = make_node<typename P::value_type>(p.mesh(), "parameter", where, P::layout, p.shape());
  n->is_leaf = true;
  set_grad_node(p, std::move(n));
}

}  // namespace detail

// Several tensors go in as one std::tuple of references (std::tie(a, b)), as everywhere in the
// library (optimizer steps, clipping); one tensor may also go in bare.

/// Marks tensors as parameters: gradients flow to them from every op that uses them after this
/// call (and from copies made after it). Each gets a fresh leaf node.
template <class... P>
void track(std::tuple<P&...> params, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where);
  std::apply([&](auto&... p) { (detail::track_one(p, where), ...); }, params);
}
template <ShardedTensor P>
void track(P& param, std::source_location where = std::source_location::current()) {
  track(std::tie(param), where);
}

/// Stops tracking: the tensors become plain values again.
template <class... P>
void untrack(std::tuple<P&...> params) {
  std::apply([](auto&... p) { (detail::set_grad_node(p, nullptr), ...); }, params);
}
template <ShardedTensor P>
void untrack(P& param) {
  untrack(std::tie(param));
}

/// The gradient of a scalar loss (rank 0, or a value summed over all its elements) with respect
/// to each parameter, each in its parameter's type and layout, as a tuple in parameter order.
/// Collective over the mesh. Uses the recorded graph once: the values it saved are freed as the
/// backward pass goes. Errors in the backward pass name the forward line of the op that raised
/// them; errors about the arguments name `where`.
template <Expression L, class... P>
std::tuple<std::remove_const_t<P>...> grad(
    const L& loss, std::tuple<P&...> params,
    std::source_location where = std::source_location::current()) {
  static_assert(detail::check_parameters<"grad", P...>());
  if constexpr (!detail::differentiable_v<typename L::value_type>)
    static_assert(sizeof(autodiff_error::loss_must_be_floating_point<detail::shown<L::spec>,
                                                                     typename L::value_type>) == 0);
  // A lazy loss evaluates at its own line; the argument checks name grad's caller.
  const auto value = [&] {
    if constexpr (L::is_lazy)
      return loss.eval();
    else
      return loss;
  }();
  std::vector<detail::GradNode*> targets;
  {
    const detail::UserSite site(where);  // the checks only: backward ops name their own lines
    int i = 0;
    std::apply(
        [&](const auto&... ps) {
          (
              [&](const auto& p) {
                if (!p.grad_node())
                  throw Error("grad", "parameter " + std::to_string(i) + " (" + p.describe() +
                                          ") is not tracked: call gshard::track on it before "
                                          "the forward pass");
                targets.push_back(p.grad_node().get());
                ++i;
              }(ps),
              ...);
        },
        params);
    if (!value.grad_node())
      throw Error("grad", "the loss (" + value.describe() +
                              ") does not depend on any tracked tensor: call gshard::track on the "
                              "parameters before the forward pass, outside gshard::NoGrad");
  }
  const auto cot = detail::backprop(value.grad_node(), detail::seed_of(value), targets);
  // Finishing the parameters' gradients (data parallelism's reduction) runs at the loss's line.
  const detail::GradNode& root = *value.grad_node();
  const detail::UserSite site(root.site.file, root.site.line);
  const detail::TraceOp op("parameter gradients", root.where.file_name(), root.where.line(),
                           "grad: ");
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple<std::remove_const_t<P>...>{
        detail::gradient_of(std::get<I>(params), cot[I])...};
  }
  (std::index_sequence_for<P...>{});
}
template <Expression L, ShardedTensor P>
std::tuple<P> grad(const L& loss, const P& param,
                   std::source_location where = std::source_location::current()) {
  return grad(loss, std::tie(param), where);
}

}  // namespace gshard
