#pragma once
// Shape ops: merge<"GS", "T">(x), split<"T", "GS">(x, {g, s}), concat<"S">(a, b, ...),
// slice<"S">(x, begin, end), pad<"S">(x, before, after, value). Eager: each returns a Sharded
// whose layout the rules (ops/shape/rules.hpp) fix at compile time from the input layouts.
//
// Every one of them is, along one dimension of the result, a move of intervals: the result's
// element o along that dimension comes from one input element (shifted: concat, slice, pad;
// a merged minor part: merge, split) or is a fill value. So all share one run-time engine,
// interval_exchange: each rank knows, from the block arithmetic alone, which interval every member
// of the group over the dimension's axes holds and needs, sends each piece once (the holder
// agreeing with the receiver on the axes that replicate the source) in ONE AllToAllv over
// those axes, and copies its own pieces locally. When nothing crosses ranks (blocks line up)
// no collective runs; merge and split whose blocks line up do not even copy.
//
// Gradients: each op records the inverse move of its cotangent through the same engine
// (merge <-> split, slice -> pad with zeros, pad -> slice, concat -> one slice per operand, into
// that operand's own split), saving no values.
//
// The parts: ops/shape/rules.hpp (layout rules, compile-time errors and checks),
// spmd/interval.hpp (the run-time engine), ops/shape/runtime.hpp (the ops on run-time layouts
// and their gradients); the typed API is here.
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <utility>
#include <vector>

#include "../expr/node.hpp"
#include "../tensor/sharded.hpp"
#include "shape/rules.hpp"
#include "shape/runtime.hpp"

namespace gshard {

/// merge<"GS", "T">(x): labels G and S (major first) become one label T of size |G|*|S|.
/// Collective over the mesh.
template <fixed_string Labels, fixed_string Merged, Expression X>
auto merge(const X& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "merge");
  if constexpr (!detail::check_merge<Labels, Merged, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    constexpr Layout staging = detail::merge_staging_layout(X::layout, Labels.view());
    constexpr Layout result = detail::merge_layout(X::layout, Labels.view(), Merged.data[0]);
    static_assert(detail::strict_check<MeshT, "merge", 0, X::layout, staging>());
    const std::string op = std::string("merge<\"").append(Labels.view()) + "\">";
    const auto s = detail::materialise_as(x, staging, op);
    const MeshT& mesh = x.mesh();
    auto r = detail::merge_runtime<T>(s, Labels.view(), Merged.data[0], detail::mesh_state(mesh),
                                      detail::axis_name_list<MeshT>());
    Shape sizes;
    for (char c : Labels.view())
      sizes.push_back(s.shape[static_cast<std::size_t>(s.layout.find(c))]);
    const std::string name = std::string("merge<\"").append(Labels.view()) + "\", \"" +
                             std::string(Merged.view()) + "\">";
    detail::record_shape(mesh, r, name, {s.grad}, [mesh, sizes](const detail::RuntimeTensor<T>& g) {
      return detail::merge_cotangent<T>(g, Labels.view(), Merged.data[0], sizes,
                                        detail::mesh_state(mesh), detail::axis_name_list<MeshT>());
    });
    return detail::to_sharded<T, MeshT, result>(mesh, r);
  }
}

/// split<"T", "GS">(x, {g, s}): label T becomes G (major) and S of sizes g and s, g*s = |T|.
/// Collective over the mesh.
template <fixed_string Label, fixed_string Into, Expression X>
auto split(const X& x, const Shape& sizes,
           std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "split");
  if constexpr (!detail::check_split<Label, Into, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    constexpr Layout result = detail::split_layout(X::layout, Label.data[0], Into.view());
    const MeshT& mesh = x.mesh();
    const auto v = detail::materialise(x);
    auto r = detail::split_runtime<T>(v, Label.data[0], Into.view(), sizes,
                                      detail::mesh_state(mesh), detail::axis_name_list<MeshT>());
    detail::record_shape(
        mesh, r,
        std::string("split<\"").append(Label.view()) + "\", \"" + std::string(Into.view()) + "\">",
        {v.grad}, [mesh](const detail::RuntimeTensor<T>& g) {
          return detail::split_cotangent<T>(g, Label.data[0], Into.view(), detail::mesh_state(mesh),
                                            detail::axis_name_list<MeshT>());
        });
    return detail::to_sharded<T, MeshT, result>(mesh, r);
  }
}

/// slice<"S">(x, begin, end): positions [begin, end) along S; the layout is kept. Collective
/// over the mesh when S is split.
template <fixed_string Label, Expression X>
auto slice(const X& x, std::int64_t begin, std::int64_t end,
           std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "slice");
  if constexpr (!detail::check_one_label<Label, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    const MeshT& mesh = x.mesh();
    const auto v = detail::materialise(x);
    auto r = detail::slice_runtime<T>(v, Label.data[0], begin, end, detail::mesh_state(mesh),
                                      detail::axis_name_list<MeshT>());
    const std::int64_t after =
        v.shape[static_cast<std::size_t>(v.layout.find(Label.data[0]))] - end;
    detail::record_shape(mesh, r, std::string("slice<\"").append(Label.view()) + "\">", {v.grad},
                         [mesh, begin, after](const detail::RuntimeTensor<T>& g) {
                           return detail::pad_runtime<T>(g, Label.data[0], begin, after, T{},
                                                         detail::mesh_state(mesh),
                                                         detail::axis_name_list<MeshT>());
                         });
    return detail::to_sharded<T, MeshT, X::layout>(mesh, r);
  }
}

/// pad<"S">(x, before, after, value): `before` positions of `value` ahead of S and `after`
/// behind it; the layout is kept. Collective over the mesh when S is split.
template <fixed_string Label, Expression X>
auto pad(const X& x, std::int64_t before, std::int64_t after,
         typename X::value_type value = typename X::value_type{},
         std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "pad");
  if constexpr (!detail::check_one_label<Label, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    const MeshT& mesh = x.mesh();
    const auto v = detail::materialise(x);
    auto r = detail::pad_runtime<T>(v, Label.data[0], before, after, value,
                                    detail::mesh_state(mesh), detail::axis_name_list<MeshT>());
    const std::int64_t n = v.shape[static_cast<std::size_t>(v.layout.find(Label.data[0]))];
    // The fill value is a constant: only x gets a gradient.
    detail::record_shape(mesh, r, std::string("pad<\"").append(Label.view()) + "\">", {v.grad},
                         [mesh, before, n](const detail::RuntimeTensor<T>& g) {
                           return detail::slice_runtime<T>(g, Label.data[0], before, before + n,
                                                           detail::mesh_state(mesh),
                                                           detail::axis_name_list<MeshT>());
                         });
    return detail::to_sharded<T, MeshT, X::layout>(mesh, r);
  }
}

namespace detail {

/// concat on typed operands (the public overloads below open the user's site first).
template <fixed_string Label, class A, class... Rest>
auto concat_typed(const A& a, const Rest&... rest) {
  if constexpr (!detail::check_one_label<Label, A>() ||
                !(detail::check_concat_operand<Label, A, Rest>() && ...)) {
    return 0;
  } else {
    using T = typename A::value_type;
    using MeshT = typename A::mesh_type;
    constexpr Layout result = detail::concat_result_layout<A, Rest...>();
    static_assert(detail::concat_all_strict_ok<Label, result, A, Rest...>(
        std::make_index_sequence<1 + sizeof...(Rest)>()));
    const std::string op = std::string("concat<\"").append(Label.view()) + "\">";
    std::vector<detail::RuntimeTensor<T>> xs;
    xs.push_back(detail::materialise_as(
        a, detail::concat_operand_layout(result, A::layout, Label.data[0]), op));
    (xs.push_back(detail::materialise_as(
         rest, detail::concat_operand_layout(result, Rest::layout, Label.data[0]), op)),
     ...);
    const MeshT& mesh = a.mesh();
    auto r = detail::concat_runtime<T>(xs, Label.data[0], detail::mesh_state(mesh),
                                       detail::axis_name_list<MeshT>());
    if constexpr (detail::differentiable_v<T>) {
      std::vector<std::shared_ptr<detail::GradNode>> inputs;
      std::vector<Layout> layouts;
      std::vector<std::int64_t> sizes;
      for (const auto& t : xs) {
        inputs.push_back(t.grad);
        layouts.push_back(t.layout);
        sizes.push_back(t.shape[static_cast<std::size_t>(t.layout.find(Label.data[0]))]);
      }
      r.grad = nullptr;
      detail::record(mesh, r, op, std::source_location{}, std::move(inputs),
                     [mesh, layouts, sizes](const detail::RuntimeTensor<T>& g) {
                       detail::Cotangents out;
                       std::int64_t offset = 0;
                       for (std::size_t i = 0; i < sizes.size(); ++i) {
                         out.push_back(detail::AnyTensor(detail::concat_cotangent<T>(
                             g, layouts[i], Label.data[0], offset, sizes[i],
                             detail::mesh_state(mesh), detail::axis_name_list<MeshT>())));
                         offset += sizes[i];
                       }
                       return out;
                     });
    }
    return detail::to_sharded<T, MeshT, result>(mesh, r);
  }
}

}  // namespace detail

/// concat<"S">(a, b, ...): the operands one after the other along S (all other labels of equal
/// size), in the first operand's layout. Collective over the mesh. Two to eight operands, each
/// overload with the call site last (a defaulted parameter cannot follow a deduced pack);
/// more operands take the variadic overload, whose errors name no call site.
template <fixed_string Label, Expression A, Expression B>
auto concat(const A& a, const B& b, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "concat");
  return detail::concat_typed<Label>(a, b);
}
template <fixed_string Label, Expression A, Expression B, Expression C>
auto concat(const A& a, const B& b, const C& c,
            std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "concat");
  return detail::concat_typed<Label>(a, b, c);
}
template <fixed_string Label, Expression A, Expression B, Expression C, Expression D>
auto concat(const A& a, const B& b, const C& c, const D& d,
            std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "concat");
  return detail::concat_typed<Label>(a, b, c, d);
}
template <fixed_string Label, Expression A, Expression B, Expression C, Expression D, Expression E>
auto concat(const A& a, const B& b, const C& c, const D& d, const E& e,
            std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "concat");
  return detail::concat_typed<Label>(a, b, c, d, e);
}
template <fixed_string Label, Expression A, Expression B, Expression C, Expression D, Expression E,
          Expression F>
auto concat(const A& a, const B& b, const C& c, const D& d, const E& e, const F& f,
            std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "concat");
  return detail::concat_typed<Label>(a, b, c, d, e, f);
}
template <fixed_string Label, Expression A, Expression B, Expression C, Expression D, Expression E,
          Expression F, Expression G>
auto concat(const A& a, const B& b, const C& c, const D& d, const E& e, const F& f, const G& g,
            std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "concat");
  return detail::concat_typed<Label>(a, b, c, d, e, f, g);
}
template <fixed_string Label, Expression A, Expression B, Expression C, Expression D, Expression E,
          Expression F, Expression G, Expression H>
auto concat(const A& a, const B& b, const C& c, const D& d, const E& e, const F& f, const G& g,
            const H& h, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "concat");
  return detail::concat_typed<Label>(a, b, c, d, e, f, g, h);
}
template <fixed_string Label, Expression A, Expression... Rest>
requires(sizeof...(Rest) >= 8) auto concat(const A& a, const Rest&... rest) {
  return detail::concat_typed<Label>(a, rest...);
}

}  // namespace gshard
