#pragma once
// Lazy elementwise expressions and their fusion. `Map<Op, Operands...>` is one op applied to
// tensors (any gshard expression) and scalars; a tree of Maps evaluates as ONE kernel with one
// output allocation (kernels/elementwise.hpp).
//
// The result's layout (compile time, docs/design.md "Elementwise layout rules"):
//   1. Labels: one tensor operand's labels must include every other's (broadcasting is by label,
//      never by position); the result has that operand's labels, in its order (the leftmost such
//      operand on ties).
//   2. Splits: each label, in that order, takes the axes of the first operand that splits it,
//      unless one of those axes is taken already (then it stays replicated). Operands split the
//      same way are read in place, replicated ones are sliced in place (no copy); any other
//      operand is resharded first (an implicit collective, shown by explain).
//   3. Pending partial sums stay pending through a linear op (+ and - of tensors with the same
//      pending axes, negation, multiplying or dividing by a scalar); before any other op they
//      are summed (an implicit AllReduce).
#include <array>
#include <memory>
#include <sstream>
#include <tuple>
#include <type_traits>
#include <utility>

#include "../kernels/elementwise.hpp"
#include "contraction.hpp"
#include "explain.hpp"
#include "node.hpp"

namespace gshard {

namespace elementwise_error {
template <class>
inline constexpr bool always_false = false;
template <auto Op, auto Operand, auto OtherOperand>
struct operand_labels_do_not_broadcast {
  static_assert(always_false<operand_labels_do_not_broadcast>,
                "gshard elementwise op: one operand's labels must include the other's "
                "(broadcasting is by label); rename labels with .as<\"...\">() or reduce first");
};
template <auto Op>
struct operands_differ_in_element_type {
  static_assert(always_false<operands_differ_in_element_type>,
                "gshard elementwise op: tensor operands must have one element type; convert with "
                "gshard::cast<T>(x)");
};
template <auto Op>
struct operands_on_different_meshes {
  static_assert(always_false<operands_on_different_meshes>,
                "gshard elementwise op: tensor operands must live on the same Mesh type");
};
template <auto Op>
struct needs_floating_point {
  static_assert(always_false<needs_floating_point>,
                "gshard elementwise op: this op needs float or double; convert with "
                "gshard::cast<float>(x)");
};
template <auto Op>
struct needs_a_tensor_operand {
  static_assert(always_false<needs_a_tensor_operand>,
                "gshard elementwise op: at least one operand must be a tensor");
};
}  // namespace elementwise_error

template <class Op, class... Kids>
class Map;

namespace detail {

template <class K>
inline constexpr bool is_map_v = false;
template <class Op, class... K>
inline constexpr bool is_map_v<Map<Op, K...>> = true;

template <class Op>
constexpr auto op_name() {
  constexpr std::string_view n = Op::name;
  return make_fixed<n.size()>(n);
}

/// The index of the operand whose labels the result takes (rule 1), or -1 when labels do not
/// nest; `bad` is then the operand whose labels are not covered.
template <std::size_t N>
constexpr int dominant_operand(const std::array<Layout, N>& ls, const std::array<bool, N>& tensor,
                               int& bad) {
  int dom = -1;
  for (std::size_t i = 0; i < N; ++i)
    if (tensor[i] && (dom < 0 || ls[i].rank > ls[static_cast<std::size_t>(dom)].rank))
      dom = static_cast<int>(i);
  bad = -1;
  if (dom < 0) return dom;
  const Layout& d = ls[static_cast<std::size_t>(dom)];
  for (std::size_t i = 0; i < N; ++i) {
    if (!tensor[i]) continue;
    for (int k = 0; k < ls[i].rank; ++k)
      if (d.find(ls[i].dims[k].label) < 0) bad = static_cast<int>(i);
  }
  return bad >= 0 ? -1 : dom;
}

/// Rules 1-3 over the operands' layouts (`tensor` false for scalars).
template <std::size_t N>
constexpr Layout map_layout(Linearity lin, const std::array<Layout, N>& ls,
                            const std::array<bool, N>& tensor) {
  int bad = -1;
  const int dom = dominant_operand(ls, tensor, bad);
  if (dom < 0) return Layout{};
  Layout out = ls[static_cast<std::size_t>(dom)];
  bool taken[max_axes]{};
  for (int d = 0; d < out.rank; ++d) {
    const char c = out.dims[d].label;
    DimLayout pick{};
    for (std::size_t i = 0; i < N && !pick.split(); ++i) {
      if (!tensor[i]) continue;
      const int k = ls[i].find(c);
      if (k < 0 || !ls[i].dims[k].split()) continue;
      bool free = true;
      for (int a = 0; a < ls[i].dims[k].axis_count; ++a)
        if (taken[ls[i].dims[k].axes[a]] || out.is_partial(ls[i].dims[k].axes[a])) free = false;
      if (free) pick = ls[i].dims[k];
    }
    for (int a = 0; a < pick.axis_count; ++a) taken[pick.axes[a]] = true;
    pick.label = c;
    out.dims[d] = pick;
  }
  // Rule 3.
  int tensors = 0;
  bool same = true;
  for (std::size_t i = 0; i < N; ++i) {
    if (!tensor[i]) continue;
    ++tensors;
    same = same && same_partial(ls[i], out);
  }
  bool keep = false;
  if (lin == Linearity::sum) keep = tensors == static_cast<int>(N) && same;
  if (lin == Linearity::scale) keep = tensors == 1;
  if (lin == Linearity::numerator) keep = tensors == 1 && tensor[0];
  if (!keep) out.partial_count = 0;
  // A dropped partial axis must not stay taken by a split.
  return out;
}

/// The layout operand `k` must have to be read in place by a kernel writing layout `out`.
constexpr Layout needed_layout(const Layout& k, const Layout& out) {
  Layout r = k;
  for (int d = 0; d < k.rank; ++d) r.dims[d] = out.dims[out.find(k.dims[d].label)];
  r.partial_count = out.partial_count;
  r.partial = out.partial;
  return r;
}

/// Whether a kernel writing layout `out` reads an operand of layout `k` in place: every
/// dimension split as in `out`, or replicated (then sliced by an offset).
constexpr bool read_in_place(const Layout& k, const Layout& out) {
  if (!same_partial(k, out)) return false;
  for (int d = 0; d < k.rank; ++d) {
    const int o = out.find(k.dims[d].label);
    if (k.dims[d].split() &&
        !(k.dims[d].axes == out.dims[o].axes && k.dims[d].axis_count == out.dims[o].axis_count))
      return false;
  }
  return true;
}

template <class K>
constexpr Layout layout_of() {
  if constexpr (Expression<K>)
    return K::layout;
  else
    return Layout{};
}

template <class K, class Fallback>
struct value_of {
  using type = Fallback;
};
template <Expression K, class Fallback>
struct value_of<K, Fallback> {
  using type = typename K::value_type;
};

template <class K>
struct value_of_mesh {
  using type = void;
};
template <Expression K>
struct value_of_mesh<K> {
  using type = typename K::mesh_type;
};

template <class... Args>
constexpr std::size_t first_tensor() {
  std::size_t i = 0, found = sizeof...(Args);
  ((found = (found == sizeof...(Args) && Expression<Args>) ? i : found, ++i), ...);
  return found == sizeof...(Args) ? 0 : found;
}

/// Operands from this index on must share one element type (where's condition may differ).
template <class Op>
constexpr std::size_t typed_from() {
  if constexpr (requires { Op::first_typed_operand; })
    return Op::first_typed_operand;
  else
    return 0;
}

/// The first tensor operand at or after typed_from (its element type is the op's).
template <class Op, class... Args>
constexpr std::size_t typed_operand() {
  constexpr std::array<bool, sizeof...(Args)> t{Expression<Args>...};
  for (std::size_t i = typed_from<Op>(); i < t.size(); ++i)
    if (t[i]) return i;
  return first_tensor<Args...>();
}

/// What a fused kernel needs while it is being assembled: the output block's geometry, and the
/// operand blocks it reads (kept alive until the kernel ran).
template <class MeshT>
struct FuseContext {
  const MeshT& mesh;
  Layout out;
  Shape shape;  // global, in out's order
  std::string op;
  Shape offset;  // global offset of this rank's output block, per dimension
  FusedBlock block;
  std::vector<std::shared_ptr<void>> keep;
  /// The tensor leaves, in the order of their ids (for the backward pass).
  struct Leaf {
    std::shared_ptr<GradNode> node;
    Layout layout;
    Shape shape;
  };
  std::vector<Leaf> leaves;

  template <class T>
  LeafEval<T> leaf(const RuntimeTensor<T>& t) {
    // Sizes per label were checked when the expression was built (Map's constructor).
    keep.push_back(std::make_shared<Kokkos::View<T*>>(t.data));
    LeafEval<T> e;
    e.id = static_cast<int>(leaves.size());
    leaves.push_back({differentiable_v<T> ? t.grad : nullptr, t.layout, t.shape});
    e.data = t.data.data();
    e.rank = out.rank;
    const Shape ext = local_extents(t.layout, t.shape, mesh.sizes());
    std::int64_t stride = 1;
    for (int d = t.layout.rank - 1; d >= 0; --d) {
      const int o = out.find(t.layout.dims[d].label);
      e.stride[o] = stride;
      if (!t.layout.dims[d].split() && out.dims[o].split())
        e.base += offset[static_cast<std::size_t>(o)] * stride;
      stride *= ext[static_cast<std::size_t>(d)];
    }
    return e;
  }
};

}  // namespace detail

/// One elementwise op over tensors and scalars, lazy. Copies share one evaluation.
template <class Op, class... Kids>
class Map {
  static constexpr std::size_t arity = sizeof...(Kids);
  static constexpr std::array<bool, arity> tensor_kids{Expression<Kids>...};
  static constexpr std::array<Layout, arity> kid_layouts{detail::layout_of<Kids>()...};
  static constexpr int dominant = [] {
    int bad = -1;
    return detail::dominant_operand(kid_layouts, tensor_kids, bad);
  }();
  static_assert(dominant >= 0, "gshard: operands checked by detail::elementwise first");
  using Dominant = std::tuple_element_t<static_cast<std::size_t>(dominant), std::tuple<Kids...>>;
  using Typed = std::tuple_element_t<detail::typed_operand<Op, Kids...>(), std::tuple<Kids...>>;

 public:
  /// Scalars take the element type of the op's tensor operands.
  using operand_type = typename Typed::value_type;
  using stored = std::tuple<std::conditional_t<Expression<Kids>, Kids, operand_type>...>;
  using value_type = std::decay_t<
      std::invoke_result_t<Op, typename detail::value_of<Kids, operand_type>::type...>>;
  using mesh_type = typename Dominant::mesh_type;
  static constexpr bool is_gshard_expression = true;
  static constexpr bool is_lazy = true;
  static constexpr Layout layout = detail::map_layout(Op::linearity, kid_layouts, tensor_kids);
  static constexpr auto spec = detail::spec_of<mesh_type, layout>();
  using result_type = Sharded<value_type, mesh_type, spec>;

  /// Checks at once (on every rank alike) that each label has one size in all operands.
  Map(std::source_location where, Op op, const Kids&... kids)
      : s_(std::make_shared<State>(where, op, stored(convert(kids)...))) {
    const detail::UserSite site(where);
    const Shape out = shape();
    std::apply([&](const auto&... k) { (check_shape(k, out), ...); }, s_->kids);
  }

  [[nodiscard]] const mesh_type& mesh() const { return std::get<dominant>(s_->kids).mesh(); }
  /// The global shape, in this expression's label order.
  [[nodiscard]] Shape shape() const { return std::get<dominant>(s_->kids).shape(); }

  /// The value, computed on first use (one kernel for the whole elementwise tree), then kept.
  [[nodiscard]] result_type eval() const {
    return detail::sharded_from<result_type>(mesh(), runtime());
  }
  /// eval().to_global(): the whole tensor on every rank. Collective.
  [[nodiscard]] std::vector<value_type> to_global() const { return eval().to_global(); }

  GSHARD_EXPRESSION_OPERATORS(Map)

 private:
  // Evaluation, fusion and explain: the library's (detail::NodeAccess), and a fused parent's.
  friend struct detail::NodeAccess;
  template <class, class...>
  friend class Map;

  detail::NodeState<value_type>& node_state() const { return *s_; }

  detail::RuntimeTensor<value_type> runtime() const {
    detail::stale_check(s_->reads, s_->where, Op::name);
    if (s_->value) return *s_->value;
    const detail::UserSite site(s_->where, "elementwise");
    static_assert(strict_ok<layout>());
    const mesh_type& m = mesh();
    detail::FuseContext<mesh_type> ctx{m, layout, shape(), Op::name, {}, {}, {}, {}};
    const Shape ext = detail::local_extents(layout, ctx.shape, m.sizes());
    ctx.block.rank = layout.rank;
    ctx.offset.resize(static_cast<std::size_t>(layout.rank));
    for (int d = 0; d < layout.rank; ++d) {
      const auto du = static_cast<std::size_t>(d);
      const detail::Block b =
          detail::block_of(layout.dims[d], ctx.shape[du], m.sizes(), m.coordinates());
      ctx.offset[du] = b.offset;
      ctx.block.extent[d] = ext[du];
      ctx.block.valid[d] = b.valid;
    }
    const auto ev = fuse<layout>(ctx);
    Kokkos::View<value_type*> out(
        Kokkos::view_alloc(std::string("gshard::elementwise"), Kokkos::WithoutInitializing),
        detail::product(ext));
    detail::run_fused(ev, out.data(), ctx.block);
    s_->value = detail::RuntimeTensor<value_type>{layout, ctx.shape, out, ReduceOp::sum};
    if constexpr (detail::differentiable_v<value_type>) record_backward(ev, ctx);
    return *s_->value;
  }

  /// The evaluator of this op inside a kernel writing layout Root.
  template <Layout Root, class Ctx>
  auto fuse(Ctx& ctx) const {
    return std::apply(
        [&](const auto&... k) {
          return detail::MapEval<Op, decltype(fuse_operand<Root>(k, ctx))...>{
              s_->op, fuse_operand<Root>(k, ctx)...};
        },
        s_->kids);
  }

  /// Strict mode: no operand of the tree needs a collective to be read by a kernel writing Root.
  template <Layout Root>
  static constexpr bool strict_ok() {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (strict_ok_operand<Root, static_cast<int>(I), Kids>() && ...);
    }
    (std::index_sequence_for<Kids...>{});
  }

  std::string plan(detail::Planner& p) const { return plan_as<layout>(p, nullptr); }

  /// Plans this op as part of a kernel writing Root; `into` is that kernel's step (null: this op
  /// is the kernel). Returns the op's formula, or the step id when it is the kernel.
  template <Layout Root>
  std::string plan_as(detail::Planner& p, detail::PlanStep* into) const {
    detail::PlanStep own;
    detail::PlanStep& st = into ? *into : own;
    std::string formula = std::string(Op::name) + "(";
    std::size_t i = 0;
    std::apply(
        [&](const auto&... k) {
          ((formula += (i++ ? ", " : "") + plan_operand<Root>(k, p, st)), ...);
        },
        s_->kids);
    formula += ")";
    if (into) return formula;
    st.op = std::string("fused elementwise ") + formula;
    st.where = detail::where_string(s_->where);
    const Shape shape_now = shape();
    st.kernel = std::string("1 kernel over the block ") +
                detail::shape_string(detail::local_extents(layout, shape_now, mesh().sizes())) +
                ", 1 output allocation";
    st.result = p.describe(layout, shape_now);
    return p.add(std::move(st));
  }

 private:
  struct State : detail::NodeState<value_type> {
    State(std::source_location w, Op o, stored k)
        : detail::NodeState<value_type>{w,
                                        {},
                                        {},
                                        std::apply(
                                            [](const auto&... x) { return detail::reads_of(x...); },
                                            k)},
          op(o),
          kids(std::move(k)) {}
    Op op;
    stored kids;
  };

  // The backward of the whole fused tree: for each tracked leaf, one kernel computing the
  // cotangent times the tree's derivative with respect to that leaf, then a sum over the labels
  // the leaf broadcast along.
  template <class Ev, class Ctx>
  void record_backward(const Ev& ev, Ctx& ctx) const {
    std::vector<std::shared_ptr<detail::GradNode>> inputs;
    std::vector<int> ids;
    for (std::size_t i = 0; i < ctx.leaves.size(); ++i)
      if (ctx.leaves[i].node) {
        inputs.push_back(ctx.leaves[i].node);
        ids.push_back(static_cast<int>(i));
      }
    if (inputs.empty()) return;
    auto backward = [ev, block = ctx.block, keep = ctx.keep, leaves = ctx.leaves, ids,
                     m = mesh()](const detail::RuntimeTensor<value_type>& g) {
      detail::Cotangents out;
      detail::LeafEval<value_type> gl;
      gl.data = g.data.data();
      gl.rank = block.rank;
      std::int64_t stride = 1;
      for (int d = block.rank - 1; d >= 0; --d) {
        gl.stride[d] = stride;
        stride *= block.extent[d];
      }
      for (int id : ids) {
        Kokkos::View<value_type*> v(Kokkos::view_alloc(std::string("gshard::elementwise_grad"),
                                                       Kokkos::WithoutInitializing),
                                    g.data.extent(0));
        detail::run_fused(detail::LeafGradientEval<decltype(gl), Ev>{gl, ev, id}, v.data(), block);
        const auto& leaf = leaves[static_cast<std::size_t>(id)];
        detail::RuntimeTensor<value_type> d(g.layout, g.shape, v, ReduceOp::sum);
        out.push_back(detail::reduce_to_labels(d, leaf.layout, detail::mesh_state(m),
                                               detail::axis_name_list<mesh_type>(),
                                               leaf.node->is_double));
      }
      return out;
    };
    detail::record(mesh(), *s_->value, std::string("elementwise ") + Op::name, s_->where,
                   std::move(inputs), std::move(backward));
  }

  template <class K>
  static void check_shape(const K& k, const Shape& out) {
    if constexpr (Expression<K>) {
      const Shape ks = k.shape();
      for (int d = 0; d < K::layout.rank; ++d) {
        const int o = layout.find(K::layout.dims[d].label);
        const auto du = static_cast<std::size_t>(d);
        if (ks[du] == out[static_cast<std::size_t>(o)]) continue;
        throw Error(Op::name, std::string("label '") + std::string(1, K::layout.dims[d].label) +
                                  "' has size " + std::to_string(ks[du]) + " in an operand \"" +
                                  std::string(K::spec.view()) + "\" of global shape " +
                                  detail::shape_string(ks) + " but " +
                                  std::to_string(out[static_cast<std::size_t>(o)]) +
                                  " in the result \"" + std::string(spec.view()) +
                                  "\" of global shape " + detail::shape_string(out));
      }
    }
  }

  template <class K>
  static auto convert(const K& k) {
    if constexpr (Expression<K>)
      return k;
    else
      return static_cast<operand_type>(k);
  }

  template <Layout Root, class K>
  static constexpr bool fused_into(const K*) {
    if constexpr (detail::is_map_v<K>)
      return detail::same_partial(K::layout, Root);
    else
      return false;
  }

  template <Layout Root, class K, class Ctx>
  static auto fuse_operand(const K& k, Ctx& ctx) {
    if constexpr (!Expression<K>) {
      return detail::ScalarEval<K>{k};
    } else if constexpr (fused_into<Root>(static_cast<const K*>(nullptr))) {
      return k.template fuse<Root>(ctx);
    } else if constexpr (detail::read_in_place(K::layout, Root)) {
      return ctx.leaf(detail::materialise(k));
    } else {
      return ctx.leaf(detail::materialise_as(k, detail::needed_layout(K::layout, Root), ctx.op));
    }
  }

  template <Layout Root, int I, class K>
  static constexpr bool strict_ok_operand() {
    if constexpr (!Expression<K>) {
      return true;
    } else if constexpr (fused_into<Root>(static_cast<const K*>(nullptr))) {
      return K::template strict_ok<Root>();
    } else {
      return detail::strict_check<mesh_type, detail::op_name<Op>(), I, K::layout,
                                  detail::needed_layout(K::layout, Root)>();
    }
  }

  template <Layout Root, class K>
  static std::string plan_operand(const K& k, detail::Planner& p, detail::PlanStep& st) {
    if constexpr (!Expression<K>) {
      std::ostringstream s;
      s << k;
      return s.str();
    } else if constexpr (fused_into<Root>(static_cast<const K*>(nullptr))) {
      return k.template plan_as<Root>(p, &st);
    } else {
      const std::string name = p.ref(k);
      if constexpr (detail::read_in_place(K::layout, Root)) {
        st.operands.push_back(name + " " + p.describe(K::layout, k.shape()) + ", read in place");
      } else {
        const Layout need = detail::needed_layout(K::layout, Root);
        const ReshardPlan plan = detail::plan_operand(k, need);
        st.operands.push_back(name + " " + p.describe(K::layout, k.shape()) + ", needed as \"" +
                              p.layout(need) + "\"");
        st.collectives.push_back({name, plan});
      }
      return name;
    }
  }

  std::shared_ptr<State> s_;
};

namespace detail {

/// Builds the Map node of `Op` over `args` (tensors and scalars), with the compile-time checks.
template <class Op, class... Args>
auto elementwise(std::source_location where, const Args&... args) {
  constexpr std::size_t n = sizeof...(Args);
  constexpr std::array<bool, n> tensor{Expression<Args>...};
  constexpr std::array<Layout, n> ls{layout_of<Args>()...};
  constexpr auto name = op_name<Op>();
  constexpr int bad = [&] {
    int b = -1;
    (void)dominant_operand(ls, tensor, b);
    return b;
  }();
  constexpr bool any_tensor = (Expression<Args> || ...);
  if constexpr (!any_tensor) {
    static_assert(sizeof(elementwise_error::needs_a_tensor_operand<detail::shown<name>>) == 0);
    return 0;
  } else if constexpr (bad >= 0) {
    constexpr int dom = [&] {
      for (std::size_t i = 0; i < n; ++i)
        if (tensor[i] && ls[i].rank >= ls[static_cast<std::size_t>(bad)].rank &&
            static_cast<int>(i) != bad)
          return static_cast<int>(i);
      return bad == 0 ? 1 : 0;
    }();
    using Bad = std::tuple_element_t<static_cast<std::size_t>(bad), std::tuple<Args...>>;
    using Dom = std::tuple_element_t<static_cast<std::size_t>(dom), std::tuple<Args...>>;
    static_assert(
        sizeof(elementwise_error::operand_labels_do_not_broadcast<
               detail::shown<name>, detail::shown<spec_of<typename Bad::mesh_type, Bad::layout>()>,
               detail::shown<spec_of<typename Dom::mesh_type, Dom::layout>()>>) == 0);
    return 0;
  } else {
    using First = std::tuple_element_t<first_tensor<Args...>(), std::tuple<Args...>>;
    constexpr bool one_mesh =
        ((!Expression<Args> ||
          std::is_same_v<typename value_of_mesh<Args>::type, typename First::mesh_type>)&&...);
    using Typed = std::tuple_element_t<typed_operand<Op, Args...>(), std::tuple<Args...>>;
    using V = typename Typed::value_type;
    constexpr bool one_type = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (
          (I < typed_from<Op>() || !tensor[I] ||
           std::is_same_v<typename value_of<std::tuple_element_t<I, std::tuple<Args...>>, V>::type,
                          V>)&&...);
    }
    (std::index_sequence_for<Args...>{});
    if constexpr (!one_mesh) {
      static_assert(sizeof(elementwise_error::operands_on_different_meshes<detail::shown<name>>) ==
                    0);
      return 0;
    } else if constexpr (!one_type) {
      static_assert(
          sizeof(elementwise_error::operands_differ_in_element_type<detail::shown<name>>) == 0);
      return 0;
    } else if constexpr (Op::floating_only && !std::is_floating_point_v<V>) {
      static_assert(sizeof(elementwise_error::needs_floating_point<detail::shown<name>>) == 0);
      return 0;
    } else {
      return Map<Op, Args...>(where, Op{}, args...);
    }
  }
}

}  // namespace detail

}  // namespace gshard
