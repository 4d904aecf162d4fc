#pragma once
// What every lazy expression shares: the run-time form of a value, the cache that makes an
// expression evaluate at most once, bringing an operand to the layout an op needs (the implicit
// collectives), and strict mode, which turns each implicit collective into a compile error.
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/einsum.hpp"
#include "../core/operators.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/graph.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

namespace detail {

template <class MeshT, Layout L>
constexpr auto spec_of() {
  constexpr std::size_t n = layout_spec_length(L, MeshT::axis_names);
  return layout_spec<n>(L, MeshT::axis_names);
}

template <class S>
RuntimeTensor<typename S::value_type> runtime_tensor(const S& t) {
  return {S::layout, t.shape(), t.local_view(), t.partial_op(), t.grad_node()};
}

template <class E>
inline constexpr bool is_sharded_v = false;
template <class T, class MeshT, fixed_string Spec>
inline constexpr bool is_sharded_v<Sharded<T, MeshT, Spec>> = true;

/// A shard an expression reads, and its update count when the expression was built.
struct VersionStamp {
  std::shared_ptr<const ShardVersion> shard;
  std::uint64_t count = 0;
};

/// The cache every lazy node holds (shared by copies of the expression): its value once
/// evaluated, and that value in other layouts once an op needed them, so neither the
/// computation nor an implicit collective runs twice. `reads`: every tensor the expression
/// reads, stamped when it was built (stale_check).
template <class T>
struct NodeState {
  std::source_location where;
  std::optional<RuntimeTensor<T>> value;
  std::vector<RuntimeTensor<T>> other_layouts;
  std::vector<VersionStamp> reads;
};

/// The library's access to a lazy node's internals: its cache, its value and its explain step
/// (private in each node type, so users see only eval(), shape(), mesh() and to_global()).
struct NodeAccess {
  template <class E>
  static auto& state(const E& e) {
    return e.node_state();
  }
  template <class E>
  static auto runtime(const E& e) {
    return e.runtime();
  }
  template <class E, class Planner>
  static std::string plan(const E& e, Planner& p) {
    return e.plan(p);
  }
};

/// Adds the shards `operand` reads (a tensor: itself; an expression: its reads; a scalar: none).
template <class E>
void collect_reads(std::vector<VersionStamp>& out, const E& operand) {
  if constexpr (is_sharded_v<E>) {
    const auto& v = ShardedAccess::version(operand);
    out.push_back({v, v->count});
  } else if constexpr (Expression<E>) {
    const auto& r = NodeAccess::state(operand).reads;
    out.insert(out.end(), r.begin(), r.end());
  }
}

template <class... E>
std::vector<VersionStamp> reads_of(const E&... operands) {
  std::vector<VersionStamp> out;
  (collect_reads(out, operands), ...);
  return out;
}

/// An expression denotes its operands' values when it was built. Once one of them has been
/// updated in place (an optimizer step, reshard_into, mark_modified), that value is gone:
/// evaluating, or reusing a value cached before the update, throws instead of silently
/// mixing old and new (docs/design.md, "Handles, laziness and in-place updates").
inline std::string where_string(const UserSiteState& w) {
  if (w.file == nullptr || w.line == 0) return "?";
  std::string_view f = w.file;
  const auto slash = f.find_last_of('/');
  if (slash != std::string_view::npos) f.remove_prefix(slash + 1);
  return std::string(f) + ":" + std::to_string(w.line);
}
inline std::string where_string(const std::source_location& w) {
  return where_string(UserSiteState{w.file_name(), static_cast<std::uint_least32_t>(w.line())});
}
inline void stale_check(const std::vector<VersionStamp>& reads, const std::source_location& built,
                        const char* op) {
  for (const VersionStamp& r : reads)
    if (r.shard->count != r.count)
      throw Error(op, std::string("this expression, built at ") + where_string(built) +
                          ", reads a tensor that " + r.shard->op + " at " +
                          where_string(r.shard->site) +
                          " updated in place after it was built; evaluate it into a Sharded "
                          "before the update to keep the old value, or build it again after the "
                          "update to use the new one");
}

/// The same pending partial axes (as sets).
constexpr bool same_partial(const Layout& a, const Layout& b) {
  if (a.partial_count != b.partial_count) return false;
  for (int i = 0; i < a.partial_count; ++i)
    if (!b.is_partial(a.partial[i])) return false;
  return true;
}

/// The layout without pending partials (zeroed, so it compares equal to a parsed one).
constexpr Layout finished_layout(Layout l) {
  l.partial_count = 0;
  l.partial = {};
  return l;
}

/// `l` also pending over the partial axes of `g` (a cotangent's) that it neither splits nor has.
inline Layout with_pending(Layout l, const Layout& g) {
  for (int i = 0; i < g.partial_count; ++i)
    if (!l.is_partial(g.partial[i]) && l.dim_on_axis(g.partial[i]) < 0)
      l.partial[l.partial_count++] = g.partial[i];
  return l;
}

/// "B:x S:y*z +w" with run-time axis names (for error messages).
inline std::string layout_text(const Layout& l, const std::vector<std::string>& names) {
  return format_layout(l, names);
}

/// The layout in double quotes. Built by appending: GCC 12's -Wrestrict misfires on
/// `"literal" + std::string&&` once the printer is inlined (an -O2 -Werror build fails).
inline std::string quoted_layout(const Layout& l, const std::vector<std::string>& names) {
  std::string s = "\"";
  s += format_layout(l, names);
  s += '"';
  return s;
}

/// A Sharded of type R holding the run-time value `r` (its shard, partial op and autodiff node).
template <class R, class MeshT, class T>
R sharded_from(const MeshT& mesh, const RuntimeTensor<T>& r) {
  R out(mesh, r.shape, r.data);
  detail::set_partial_op(out, r.partial_op);
  detail::set_grad_node(out, r.grad);
  return out;
}

/// The value of an expression (a Sharded is its own value; a lazy node evaluates once).
template <class E>
RuntimeTensor<typename E::value_type> materialise(const E& e) {
  if constexpr (is_sharded_v<E>)
    return runtime_tensor(e);
  else
    return NodeAccess::runtime(e);
}

/// The value of `e` in layout `need` (same labels, any order): resharded when it differs, which
/// is where implicit collectives happen. Cached on lazy nodes.
template <class E>
RuntimeTensor<typename E::value_type> materialise_as(const E& e, const Layout& need,
                                                     const std::string& op) {
  using T = typename E::value_type;
  using MeshT = typename E::mesh_type;
  RuntimeTensor<T> t = materialise(e);
  if (t.layout == need) return t;
  if (t.partial_op != ReduceOp::sum && need.partial_count > 0)
    throw Error(op, "an operand holds pending max/min partials; finish them with reshard first");
  if constexpr (!is_sharded_v<E>) {
    for (const auto& v : NodeAccess::state(e).other_layouts)
      if (v.layout == need) return v;
  }
  // The same global value in another layout: it keeps the node (see spmd reshard).
  RuntimeTensor<T> out =
      reshard_runtime(t, need, detail::mesh_state(e.mesh()), axis_name_list<MeshT>());
  out.grad = t.grad;
  if constexpr (!is_sharded_v<E>) NodeAccess::state(e).other_layouts.push_back(out);
  return out;
}

/// `x` without pending partials: finished with the reshard engine (AllReduce over them), the
/// implicit collective before a non-linear op.
template <class T>
RuntimeTensor<T> finish_pending(const RuntimeTensor<T>& x, const MeshState& mesh,
                                const std::vector<std::string>& axis_names) {
  if (x.layout.partial_count == 0) return x;
  RuntimeTensor<T> out = reshard_runtime(x, finished_layout(x.layout), mesh, axis_names);
  out.partial_op = ReduceOp::sum;  // nothing pending any more
  out.grad = x.grad;               // the same value: it keeps the node
  return out;
}

/// The reshard plan of an operand that an op needs in layout `need` (for explain).
template <class E>
ReshardPlan plan_operand(const E& e, const Layout& need) {
  using MeshT = typename E::mesh_type;
  const Layout from = E::layout;
  return plan_reshard(from, need, e.shape(), e.mesh().sizes(), e.mesh().coordinates(),
                      axis_name_list<MeshT>(),
                      static_cast<std::int64_t>(sizeof(typename E::value_type)));
}

/// Strict mode: fails to compile when operand `Which` of `Op` must communicate to go from
/// `From` to `To`.
template <class MeshT, fixed_string Op, int Which, Layout From, Layout To>
constexpr bool strict_check() {
  if constexpr (strict_mode && !no_communication(From, To)) {
    return sizeof(strict_error::implicit_collective<detail::shown<Op>, detail::shown<Which>,
                                                    detail::shown<spec_of<MeshT, From>()>,
                                                    detail::shown<spec_of<MeshT, To>()>>) == 0;
  } else {
    return true;
  }
}

/// Strict mode: fails to compile when evaluating into a declared layout communicates.
template <class MeshT, Layout From, Layout To>
constexpr bool strict_evaluation_check() {
  if constexpr (strict_mode && !no_communication(From, To)) {
    return sizeof(strict_error::evaluation_into_layout_communicates<
                  detail::shown<spec_of<MeshT, From>()>, detail::shown<spec_of<MeshT, To>()>>) == 0;
  } else {
    return true;
  }
}

}  // namespace detail

/// Evaluates `e` into Target's layout (the same labels) at the user's line `where`: an
/// expression's own layout is inferred, so the declared type is the annotation that fixes it
/// (GSPMD's rule). When the layouts differ the value is resharded, and the trace shows that
/// reshard at `where`; under GSHARD_STRICT it must be written reshard<Target>(expr) when it
/// communicates (`Explicit`). A Sharded is resharded only when that moves no data (conversions
/// never hide a collective: tensor/sharded.hpp).
template <class Target, bool Explicit = false, class E>
Target evaluate_at(const E& e, std::source_location where, const char* op) {
  const detail::UserSite site(where, op);
  if constexpr (detail::is_sharded_v<E>) {
    if constexpr (!Explicit) static_assert(detail::no_communication(E::layout, Target::layout));
    return reshard<Target>(e, where);
  } else {
    using R = typename E::result_type;
    if constexpr (std::is_same_v<R, Target>) {
      return e.eval();
    } else {
      if constexpr (!Explicit)
        static_assert(
            detail::strict_evaluation_check<typename E::mesh_type, R::layout, Target::layout>());
      return reshard<Target>(e.eval(), where);
    }
  }
}

/// reshard<Target>(expr): evaluates a lazy expression into Target's layout. Collective.
template <class Target, Expression E>
requires(E::is_lazy) Target
    reshard(const E& e, std::source_location where = std::source_location::current()) {
  return evaluate_at<Target, true>(e, where, "reshard");
}

}  // namespace gshard
