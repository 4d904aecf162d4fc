#pragma once
// gshard::einsum<"GSM,EMH->EGSH">(a, b) and einsum<"GSM->GS">(a): the result's layout is fixed at
// compile time by the rules of core/einsum.hpp; at run time each operand is resharded to the
// layout those rules give it (often no communication), then every rank contracts its blocks.
#include <string>

#include "../core/einsum.hpp"
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

template <class MeshT, Layout L>
constexpr auto spec_of() {
  constexpr std::size_t n = layout_spec_length(L, MeshT::axis_names);
  return layout_spec<n>(L, MeshT::axis_names);
}

/// A tensor as the run-time engine sees it: layout, global shape (layout order), local shard.
template <class T>
struct RuntimeTensor {
  Layout layout{};
  Shape shape;
  Kokkos::View<T*> data;
  ReduceOp partial_op = ReduceOp::sum;
};

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
                                const RuntimeTensor<T>& a, const RuntimeTensor<T>* b) {
  const bool binary = b != nullptr;
  const EinsumLayouts rules = infer_einsum(spec, a.layout, binary ? b->layout : Layout{});
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
  out.data = Kokkos::View<T*>("gshard::einsum", lo.size());
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

template <class S>
RuntimeTensor<typename S::value_type> runtime_tensor(const S& t) {
  return {S::layout, t.shape(), t.local_view(), t.partial_op()};
}

template <fixed_string Einsum, class Out, class MeshT, class T>
Out typed_einsum(const MeshT& mesh, const RuntimeTensor<T>& a, const RuntimeTensor<T>* b) {
  constexpr EinsumParse p = parse_einsum(Einsum.view());
  RuntimeTensor<T> r =
      einsum_runtime<T>(Einsum.view(), p.spec, mesh.state(), axis_name_list<MeshT>(), a, b);
  return Out(mesh, std::move(r.shape), std::move(r.data));
}

}  // namespace detail

/// Binary einsum over sharded tensors. Collective over the mesh.
template <fixed_string Einsum, class T, class MeshT, fixed_string SA, fixed_string SB>
auto einsum(const Sharded<T, MeshT, SA>& a, const Sharded<T, MeshT, SB>& b) {
  using A = Sharded<T, MeshT, SA>;
  using B = Sharded<T, MeshT, SB>;
  static_assert(detail::check_einsum_spec<Einsum>());
  constexpr EinsumParse p = parse_einsum(Einsum.view());
  if constexpr (p.error != EinsumError::none || p.spec.operand_count != 2) {
    static_assert(p.error != EinsumError::none ||
                  sizeof(einsum_error::wrong_operand_count<Einsum>) == 0);
    return a;
  } else {
    static_assert(detail::check_operand<Einsum, 0, A>() && detail::check_operand<Einsum, 1, B>());
    constexpr EinsumLayouts L = infer_einsum(p.spec, A::layout, B::layout);
    using Out = Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>;
    const auto rb = detail::runtime_tensor(b);
    return detail::typed_einsum<Einsum, Out>(a.mesh(), detail::runtime_tensor(a), &rb);
  }
}

/// Unary einsum: transposes and sums over labels. Collective over the mesh.
template <fixed_string Einsum, class T, class MeshT, fixed_string SA>
auto einsum(const Sharded<T, MeshT, SA>& a) {
  using A = Sharded<T, MeshT, SA>;
  static_assert(detail::check_einsum_spec<Einsum>());
  constexpr EinsumParse p = parse_einsum(Einsum.view());
  if constexpr (p.error != EinsumError::none || p.spec.operand_count != 1) {
    static_assert(p.error != EinsumError::none ||
                  sizeof(einsum_error::wrong_operand_count<Einsum>) == 0);
    return a;
  } else {
    static_assert(detail::check_operand<Einsum, 0, A>());
    constexpr EinsumLayouts L = infer_einsum(p.spec, A::layout, Layout{});
    using Out = Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>;
    return detail::typed_einsum<Einsum, Out>(a.mesh(), detail::runtime_tensor(a),
                                             static_cast<const detail::RuntimeTensor<T>*>(nullptr));
  }
}

}  // namespace gshard
