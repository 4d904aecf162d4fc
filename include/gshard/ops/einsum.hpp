#pragma once
// gshard::einsum<"GSM,EMH->EGSH">(a, b) and einsum<"GSM->GS">(a): the result's layout is fixed at
// compile time by the rules of core/einsum.hpp; at run time each operand is resharded to the
// layout those rules give it (often no communication), then every rank contracts its blocks.
#include <array>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>

#include "../core/einsum.hpp"
#include "../expr/contraction.hpp"
#include "../expr/explain.hpp"
#include "../expr/node.hpp"
#include "../kernels/contract.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

namespace einsum_error {
template <class>
inline constexpr bool always_false = false;
template <auto Piece, auto Einsum>
struct malformed_einsum {
  static_assert(always_false<malformed_einsum>,
                "gshard::einsum: write \"ab,bc->ac\" or \"ab->a\" with one-letter labels");
};
template <auto Label, auto Einsum>
struct label_repeated_in_einsum_term {
  static_assert(always_false<label_repeated_in_einsum_term>,
                "gshard::einsum: a label appears twice in one operand or in the output");
};
template <auto Label, auto Einsum>
struct output_label_in_no_operand {
  static_assert(always_false<output_label_in_no_operand>,
                "gshard::einsum: an output label appears in no operand");
};
template <auto EinsumLabels, auto OperandSpec>
struct operand_labels_differ_from_its_spec {
  static_assert(always_false<operand_labels_differ_from_its_spec>,
                "gshard::einsum: an operand's einsum labels must be the labels of its spec; rename "
                "them with .as<\"...\">()");
};
template <auto Term, auto Einsum>
struct more_than_8_labels_in_einsum_term {
  static_assert(always_false<more_than_8_labels_in_einsum_term>,
                "gshard::einsum: an operand or the output has more than 8 labels");
};
template <auto Einsum>
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
      return sizeof(einsum_error::malformed_einsum<detail::shown<what>, detail::shown<Einsum>>) ==
             0;
    else if constexpr (p.error == EinsumError::label_repeated)
      return sizeof(einsum_error::label_repeated_in_einsum_term<detail::shown<what>,
                                                                detail::shown<Einsum>>) == 0;
    else if constexpr (p.error == EinsumError::too_many_labels)
      return sizeof(einsum_error::more_than_8_labels_in_einsum_term<detail::shown<what>,
                                                                    detail::shown<Einsum>>) == 0;
    else
      return sizeof(einsum_error::output_label_in_no_operand<detail::shown<what>,
                                                             detail::shown<Einsum>>) == 0;
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
    return sizeof(einsum_error::operand_labels_differ_from_its_spec<
                  detail::shown<labels>, detail::shown<Operand::spec>>) == 0;
  }
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
    const detail::UserSite site(where);
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
    return detail::sharded_from<result_type>(mesh(), runtime());
  }
  [[nodiscard]] std::vector<value_type> to_global() const { return eval().to_global(); }

  GSHARD_EXPRESSION_OPERATORS(EinsumExpr)

 private:
  friend struct detail::NodeAccess;  // evaluation and explain

  detail::NodeState<value_type>& node_state() const { return *s_; }

  detail::RuntimeTensor<value_type> runtime() const {
    detail::stale_check(s_->reads, s_->where, "einsum");
    if (s_->value) return *s_->value;
    const detail::UserSite site(s_->where, "einsum");
    const std::string op = std::string("einsum \"").append(Einsum.view()).append("\"");
    const mesh_type& m = mesh();
    if constexpr (binary) {
      const detail::EinsumChoice choice = choose();
      const auto a =
          detail::materialise_as(std::get<0>(s_->operands), choice.compute.operands[0], op);
      const auto b =
          detail::materialise_as(std::get<1>(s_->operands), choice.compute.operands[1], op);
      const auto names = detail::axis_name_list<mesh_type>();
      auto out = detail::einsum_runtime<value_type>(
          Einsum.view(), parsed.spec, detail::mesh_state(m), names, a, &b, &choice.compute);
      // The cheaper plan ends in another layout: bring it to the one the type promises.
      if (!choice.by_rules)
        out = detail::reshard_runtime(out, layout, detail::mesh_state(m), names);
      s_->value = out;
      record_backward(a, &b);
    } else {
      const auto a = detail::materialise_as(std::get<0>(s_->operands), rules.operands[0], op);
      s_->value = detail::einsum_runtime<value_type>(
          Einsum.view(), parsed.spec, detail::mesh_state(m), detail::axis_name_list<mesh_type>(), a,
          static_cast<const detail::RuntimeTensor<value_type>*>(nullptr), &rules);
      record_backward(a, nullptr);
    }
    return *s_->value;
  }

  // The cost model's plan (expr/contraction.hpp); the same on every rank.
  detail::EinsumChoice choose() const {
    const auto& x = std::get<0>(s_->operands);
    const auto& y = std::get<1>(s_->operands);
    return detail::choose_einsum_layouts(
        parsed.spec, rules, A::layout, x.shape(), B::layout, y.shape(), mesh().sizes(),
        detail::axis_name_list<mesh_type>(), static_cast<std::int64_t>(sizeof(value_type)));
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
    const Shape out = shape();
    EinsumLayouts use = rules;
    if constexpr (binary) {
      const detail::EinsumChoice choice = choose();
      use = choice.compute;
      st.note = choice.by_rules
                    ? std::string()
                    : "planner: " + std::to_string(choice.bytes) + " bytes sent instead of " +
                          std::to_string(choice.rules_bytes) + " by the layout rules' plan (" +
                          std::to_string(choice.candidates) + " plans costed)";
      if (!choice.by_rules)
        st.after = detail::PlannedCollective{
            "the result", detail::plan_reshard(use.output, layout, out, m.sizes(), m.coordinates(),
                                               detail::axis_name_list<mesh_type>(),
                                               static_cast<std::int64_t>(sizeof(value_type)))};
    }
    operand(std::get<0>(s_->operands), use.operands[0]);
    if constexpr (binary) operand(std::get<1>(s_->operands), use.operands[1]);
    const detail::LocalBlock lo = detail::local_block(use.output, out, m.sizes());
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
        : detail::NodeState<value_type>{w,
                                        {},
                                        {},
                                        std::apply(
                                            [](const auto&... x) { return detail::reads_of(x...); },
                                            o)},
          operands(std::move(o)) {}
    Operands operands;
  };

  // Gradient: each operand's cotangent is an einsum of the result's cotangent with the other
  // operand (saved as the forward pass used it), broadcast along labels summed away.
  void record_backward(const detail::RuntimeTensor<value_type>& a,
                       const detail::RuntimeTensor<value_type>* b) const {
    if (!detail::recording() || !(a.grad || (b && b->grad))) return;
    using RT = detail::RuntimeTensor<value_type>;
    // Saved without their nodes: the node keeps its inputs already.
    RT sa(a.layout, a.shape, a.data, a.partial_op);
    std::optional<RT> sb;
    if (b) sb = RT(b->layout, b->shape, b->data, b->partial_op);
    // One capture for both flags: a unary einsum never reads need[1] (clang flags unused captures).
    const std::array<bool, 2> need{a.grad != nullptr, b && b->grad};
    auto backward = [sa, sb, need, m = mesh()](const RT& g) {
      const auto names = detail::axis_name_list<mesh_type>();
      const std::string_view out = parsed.spec.output;
      const std::string_view la = parsed.spec.operands[0];
      detail::Cotangents r;
      if (need[0])
        r.push_back(detail::einsum_operand_cotangent<value_type>(
            out, la, sa.layout, sa.shape, g, binary ? parsed.spec.operands[1] : std::string_view{},
            sb ? &*sb : nullptr, detail::mesh_state(m), names));
      else
        r.push_back(std::nullopt);
      if constexpr (binary) {
        if (need[1])
          r.push_back(detail::einsum_operand_cotangent<value_type>(
              out, parsed.spec.operands[1], sb->layout, sb->shape, g, la, &sa,
              detail::mesh_state(m), names));
        else
          r.push_back(std::nullopt);
      }
      return r;
    };
    // Only the operands that are tracked become inputs; others keep a null slot.
    std::vector<std::shared_ptr<detail::GradNode>> inputs{a.grad};
    if constexpr (binary) inputs.push_back(b->grad);
    detail::record(mesh(), *s_->value, std::string("einsum \"").append(Einsum.view()) + "\"",
                   s_->where, std::move(inputs), std::move(backward));
  }

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
    return sizeof(einsum_error::wrong_operand_count<detail::shown<Einsum>>) == 0;
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
