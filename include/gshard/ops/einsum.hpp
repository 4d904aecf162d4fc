#pragma once
// gshard::einsum<"GSM,EMH->EGSH">(a, b) and einsum<"GSM->GS">(a): the result's layout is fixed at
// compile time by the rules of core/einsum.hpp; at run time each operand is resharded to the
// layout those rules give it (often no communication), then every rank contracts its blocks.
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>

#include "../core/einsum.hpp"
#include "../expr/explain.hpp"
#include "../expr/node.hpp"
#include "../kernels/contract.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

namespace einsum_error {
template <class>
inline constexpr bool always_false = false;
template <fixed_string Piece, fixed_string Einsum>
struct malformed_einsum {
  static_assert(always_false<malformed_einsum>,
                "gshard::einsum: write \"ab,bc->ac\" or \"ab->a\" with one-letter labels");
};
template <fixed_string Label, fixed_string Einsum>
struct label_repeated_in_einsum_term {
  static_assert(always_false<label_repeated_in_einsum_term>,
                "gshard::einsum: a label appears twice in one operand or in the output");
};
template <fixed_string Label, fixed_string Einsum>
struct output_label_in_no_operand {
  static_assert(always_false<output_label_in_no_operand>,
                "gshard::einsum: an output label appears in no operand");
};
template <fixed_string EinsumLabels, fixed_string OperandSpec>
struct operand_labels_differ_from_its_spec {
  static_assert(always_false<operand_labels_differ_from_its_spec>,
                "gshard::einsum: an operand's einsum labels must be the labels of its spec; rename "
                "them with .as<\"...\">()");
};
template <fixed_string Term, fixed_string Einsum>
struct more_than_8_labels_in_einsum_term {
  static_assert(always_false<more_than_8_labels_in_einsum_term>,
                "gshard::einsum: an operand or the output has more than 8 labels");
};
template <fixed_string Einsum>
struct wrong_operand_count {
  static_assert(always_false<wrong_operand_count>,
                "gshard::einsum: the spec's operand count differs from the arguments given");
};
}  // namespace einsum_error

namespace detail {

template <fixed_string Einsum>
constexpr bool check_einsum_spec() {
  constexpr EinsumParse p = parse_einsum(Einsum.view());
  if constexpr (p.error == EinsumError::none) {
    return true;
  } else {
    constexpr auto what = make_fixed<p.offending.size()>(p.offending);
    if constexpr (p.error == EinsumError::malformed)
      return sizeof(einsum_error::malformed_einsum<what, Einsum>) == 0;
    else if constexpr (p.error == EinsumError::label_repeated)
      return sizeof(einsum_error::label_repeated_in_einsum_term<what, Einsum>) == 0;
    else if constexpr (p.error == EinsumError::too_many_labels)
      return sizeof(einsum_error::more_than_8_labels_in_einsum_term<what, Einsum>) == 0;
    else
      return sizeof(einsum_error::output_label_in_no_operand<what, Einsum>) == 0;
  }
}

constexpr bool same_labels(std::string_view term, const Layout& l) {
  if (static_cast<int>(term.size()) != l.rank) return false;
  for (char c : term)
    if (l.find(c) < 0) return false;
  return true;
}

template <fixed_string Einsum, int Which, class Operand>
constexpr bool check_operand() {
  constexpr EinsumParse p = parse_einsum(Einsum.view());
  constexpr std::string_view term = p.spec.operands[Which];
  if constexpr (same_labels(term, Operand::layout)) {
    return true;
  } else {
    constexpr auto labels = make_fixed<term.size()>(term);
    return sizeof(einsum_error::operand_labels_differ_from_its_spec<labels, Operand::spec>) == 0;
  }
}

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
    if (t.layout == need) return t;
    const ReshardPlan plan = plan_reshard(t.layout, need, t.shape, mesh.sizes, mesh.coords,
                                          axis_names, std::int64_t{sizeof(T)});
    RuntimeTensor<T> out{need, shape_in(need, t.layout, t.shape), {}, t.partial_op};
    out.data = ReshardExecutor<T>(plan, mesh, t.partial_op).run(t.data);
    return out;
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

}  // namespace detail

/// A lazy einsum: evaluated once, when its value is first needed (by eval(), an assignment to a
/// Sharded, or an op that needs it materialised).
template <fixed_string Einsum, class A, class B>
class EinsumExpr {
  static constexpr EinsumParse parsed = parse_einsum(Einsum.view());
  static constexpr bool binary = !std::is_void_v<B>;
  static constexpr EinsumLayouts rules = [] {
    if constexpr (binary)
      return infer_einsum(parsed.spec, A::layout, B::layout);
    else
      return infer_einsum(parsed.spec, A::layout, Layout{});
  }();
  using Operands = std::conditional_t<binary, std::tuple<A, B>, std::tuple<A>>;

 public:
  using value_type = typename A::value_type;
  using mesh_type = typename A::mesh_type;
  static constexpr bool is_gshard_expression = true;
  static constexpr bool is_lazy = true;
  static constexpr Layout layout = rules.output;
  static constexpr auto spec = detail::spec_of<mesh_type, layout>();
  using result_type = Sharded<value_type, mesh_type, spec>;

  /// Checks at once (on every rank alike) that labels shared by the operands agree in size.
  EinsumExpr(std::source_location where, Operands operands)
      : s_(std::make_shared<State>(where, std::move(operands))) {
    for (char c : parsed.spec.operands[0]) (void)size_of(c);
  }

  [[nodiscard]] const mesh_type& mesh() const { return std::get<0>(s_->operands).mesh(); }
  /// The global shape of the result, in output label order (checks that shared labels agree).
  [[nodiscard]] Shape shape() const {
    Shape out;
    for (char c : parsed.spec.output) out.push_back(size_of(c));
    return out;
  }
  [[nodiscard]] result_type eval() const {
    const detail::RuntimeTensor<value_type> r = runtime();
    return result_type(mesh(), r.shape, r.data);
  }
  [[nodiscard]] std::vector<value_type> to_global() const { return eval().to_global(); }

  GSHARD_EXPRESSION_OPERATORS(EinsumExpr)

  // --- for the library ---
  detail::NodeState<value_type>& node_state() const { return *s_; }

  detail::RuntimeTensor<value_type> runtime() const {
    if (s_->value) return *s_->value;
    const std::string op = std::string("einsum \"").append(Einsum.view()).append("\"");
    const auto a = detail::materialise_as(std::get<0>(s_->operands), rules.operands[0], op);
    const mesh_type& m = mesh();
    if constexpr (binary) {
      const auto b = detail::materialise_as(std::get<1>(s_->operands), rules.operands[1], op);
      s_->value =
          detail::einsum_runtime<value_type>(Einsum.view(), parsed.spec, m.state(),
                                             detail::axis_name_list<mesh_type>(), a, &b, &rules);
    } else {
      s_->value = detail::einsum_runtime<value_type>(
          Einsum.view(), parsed.spec, m.state(), detail::axis_name_list<mesh_type>(), a,
          static_cast<const detail::RuntimeTensor<value_type>*>(nullptr), &rules);
    }
    return *s_->value;
  }

  std::string plan(detail::Planner& p) const {
    detail::PlanStep st;
    st.op = std::string("einsum \"").append(Einsum.view()).append("\"");
    st.where = detail::where_string(s_->where);
    const auto& m = mesh();
    std::vector<detail::LocalBlock> blocks;
    auto operand = [&](const auto& x, const Layout& need) {
      using X = std::decay_t<decltype(x)>;
      const std::string name = p.ref(x);
      std::string line = name + " " + p.describe(X::layout, x.shape());
      if (!(X::layout == need)) {
        line += ", needed as \"" + p.layout(need) + "\"";
        st.collectives.push_back({name, detail::plan_operand(x, need)});
      }
      st.operands.push_back(line);
      blocks.push_back(
          detail::local_block(need, detail::shape_in(need, X::layout, x.shape()), m.sizes()));
    };
    operand(std::get<0>(s_->operands), rules.operands[0]);
    if constexpr (binary) operand(std::get<1>(s_->operands), rules.operands[1]);
    const Shape out = shape();
    const detail::LocalBlock lo = detail::local_block(layout, out, m.sizes());
    const detail::GemmShape g =
        detail::contract_shape(blocks[0], binary ? &blocks[1] : nullptr, lo);
    st.kernel = binary
                    ? std::string("batched GEMM, batch ") + std::to_string(g.batch) + ", m " +
                          std::to_string(g.m) + ", n " + std::to_string(g.n) + ", k " +
                          std::to_string(g.k)
                    : std::string("sum/transpose into ") + std::to_string(lo.size()) + " elements";
    st.result = p.describe(layout, out);
    return p.add(std::move(st));
  }

 private:
  struct State : detail::NodeState<value_type> {
    State(std::source_location w, Operands o)
        : detail::NodeState<value_type>{w, {}, {}}, operands(std::move(o)) {}
    Operands operands;
  };

  std::int64_t size_of(char c) const {
    const auto& a = std::get<0>(s_->operands);
    const Shape sa = a.shape();
    const int da = A::layout.find(c);
    if constexpr (binary) {
      const auto& b = std::get<1>(s_->operands);
      const Shape sb = b.shape();
      const int db = B::layout.find(c);
      if (da >= 0 && db >= 0 &&
          sa[static_cast<std::size_t>(da)] != sb[static_cast<std::size_t>(db)])
        throw Error("einsum", std::string("\"").append(Einsum.view()) + "\": label '" +
                                  std::string(1, c) + "' has size " +
                                  std::to_string(sa[static_cast<std::size_t>(da)]) +
                                  " in the first operand \"" + std::string(A::spec.view()) +
                                  "\" (global shape " + detail::shape_string(sa) + ") but " +
                                  std::to_string(sb[static_cast<std::size_t>(db)]) +
                                  " in the second \"" + std::string(B::spec.view()) +
                                  "\" (global shape " + detail::shape_string(sb) + ")");
      if (da < 0) return sb[static_cast<std::size_t>(db)];
    }
    return sa[static_cast<std::size_t>(da)];
  }

  std::shared_ptr<State> s_;
};

namespace detail {

template <fixed_string Einsum, int Operands>
constexpr bool einsum_spec_ok() {
  constexpr EinsumParse p = parse_einsum(Einsum.view());
  if constexpr (!check_einsum_spec<Einsum>()) {
    return false;
  } else if constexpr (p.spec.operand_count != Operands) {
    return sizeof(einsum_error::wrong_operand_count<Einsum>) == 0;
  } else {
    return true;
  }
}

template <fixed_string Einsum, int Which, class Operand, Layout Need>
constexpr bool einsum_strict_ok() {
  return strict_check<typename Operand::mesh_type, Einsum, Which, Operand::layout, Need>();
}

}  // namespace detail

/// Binary einsum over sharded tensors or expressions, lazy. Collective over the mesh when
/// evaluated.
template <fixed_string Einsum, Expression A, Expression B>
auto einsum(const A& a, const B& b, std::source_location where = std::source_location::current()) {
  if constexpr (!detail::einsum_spec_ok<Einsum, 2>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename A::value_type, typename B::value_type> &&
                      std::is_same_v<typename A::mesh_type, typename B::mesh_type>,
                  "gshard::einsum: operands must have the same element type and Mesh type");
    static_assert(detail::check_operand<Einsum, 0, A>() && detail::check_operand<Einsum, 1, B>());
    constexpr EinsumParse p = parse_einsum(Einsum.view());
    constexpr EinsumLayouts L = infer_einsum(p.spec, A::layout, B::layout);
    static_assert(detail::einsum_strict_ok<Einsum, 0, A, L.operands[0]>() &&
                  detail::einsum_strict_ok<Einsum, 1, B, L.operands[1]>());
    return EinsumExpr<Einsum, A, B>(where, std::tuple<A, B>(a, b));
  }
}

/// Unary einsum: transposes and sums over labels, lazy.
template <fixed_string Einsum, Expression A>
auto einsum(const A& a, std::source_location where = std::source_location::current()) {
  if constexpr (!detail::einsum_spec_ok<Einsum, 1>()) {
    return 0;
  } else {
    static_assert(detail::check_operand<Einsum, 0, A>());
    constexpr EinsumParse p = parse_einsum(Einsum.view());
    constexpr EinsumLayouts L = infer_einsum(p.spec, A::layout, Layout{});
    static_assert(detail::einsum_strict_ok<Einsum, 0, A, L.operands[0]>());
    return EinsumExpr<Einsum, A, void>(where, std::tuple<A>(a));
  }
}

}  // namespace gshard
