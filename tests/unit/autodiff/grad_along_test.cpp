// Gradients of the batched index ops (take_along w.r.t. the table, scatter_add_along w.r.t. the
// values; indices get none) against central finite differences in double, on every listed mesh
// shape, sizes uneven w.r.t. the axes: the MoE fast path (batch labels split alike), layouts that
// need reshards (S split, batch labels split otherwise, index-only labels split), pending partial
// inputs, nonlinearities after the op, negative indices, a dispatch/combine round trip;
// loss = einsum of the op's output with a fixed random tensor.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/ops/index.hpp>
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gs::Shape;
using gshard::test::fd_relative_error;
using gshard::test::make;
using gshard::test::on_every_mesh;

// Indices in [-1, n) with repeats (gradients accumulate) and some -1 ("no element").
template <class C>
C make_indices(const typename C::mesh_type& mesh, const Shape& shape, std::int64_t n,
               unsigned salt) {
  using I = typename C::value_type;
  std::int64_t count = 1;
  for (auto s : shape) count *= s;
  std::vector<I> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<I>((static_cast<std::int64_t>(i) * 5 + salt) % (n + 1) - 1);
  return gs::from_global<C>(mesh, shape, v);
}

template <class M>
void take_along_cases(const M& mesh) {
  using D = double;
  // 1. The MoE dispatch: G over x in both, S unsplit, M over y.
  {
    using T = gs::Sharded<D, M, "G:x S M:y">;
    using C = gs::Sharded<std::int32_t, M, "G:x E C">;
    using R = gs::Sharded<D, M, "G E C M">;
    const C ids = make_indices<C>(mesh, {3, 2, 3}, 5, 1);
    const R r = make<R>(mesh, {3, 2, 3, 3}, 2);
    auto f = [&](const T& t) {
      return gs::einsum<"GECM,GECM->">(gs::take_along<"S">(t, ids), r).eval();
    };
    CHECK(fd_relative_error(f, make<T>(mesh, {3, 5, 3}, 3)) < 1e-6);
  }
  // 2. Reshards first: S split over x (gathered), G split over y by the indices only, M's y
  // taken by the indices; int64, trusted bounds; a nonlinearity after.
  {
    using T = gs::Sharded<D, M, "S:x M:y G">;
    using C = gs::Sharded<std::int64_t, M, "E G:y C">;
    using R = gs::Sharded<D, M, "E G C M">;
    const C ids = make_indices<C>(mesh, {2, 3, 2}, 6, 2);
    const R r = make<R>(mesh, {2, 3, 2, 3}, 4);
    auto f = [&](const T& t) {
      auto y = gs::take_along<"S">(t, ids, gs::Bounds::trusted);
      return gs::einsum<"EGCM,EGCM->">(gs::tanh(y), r).eval();
    };
    CHECK(fd_relative_error(f, make<T>(mesh, {6, 3, 3}, 5)) < 1e-6);
  }
  // 3. A pending partial table (K contracted over y), index-only label C split over y too, so
  // the cotangent is partial over y on its way back; then a sigmoid.
  {
    using A = gs::Sharded<D, M, "G:x S M K:y">;
    using W = gs::Sharded<D, M, "K:y">;
    using C = gs::Sharded<std::int32_t, M, "G:x C:y">;
    using R = gs::Sharded<D, M, "G C M">;
    const C ids = make_indices<C>(mesh, {3, 5}, 4, 3);
    const R r = make<R>(mesh, {3, 5, 2}, 6);
    auto f = [&](const A& a, const W& w) {
      auto y = gs::take_along<"S">(gs::einsum<"GSMK,K->GSM">(a, w), ids);
      return gs::einsum<"GCM,GCM->">(gs::sigmoid(y), r).eval();
    };
    CHECK(fd_relative_error(f, make<A>(mesh, {3, 4, 2, 3}, 7), make<W>(mesh, {3}, 8)) < 1e-6);
  }
  // 4. No batch label, two index labels, the table's M split over x (kept).
  {
    using T = gs::Sharded<D, M, "M:x S">;
    using C = gs::Sharded<std::int64_t, M, "E:y C">;
    using R = gs::Sharded<D, M, "E C M">;
    const C ids = make_indices<C>(mesh, {3, 2}, 5, 4);
    const R r = make<R>(mesh, {3, 2, 3}, 9);
    auto f = [&](const T& t) {
      return gs::einsum<"ECM,ECM->">(gs::take_along<"S">(t, ids), r).eval();
    };
    CHECK(fd_relative_error(f, make<T>(mesh, {3, 5}, 10)) < 1e-6);
  }
  // 5. Three axes: G over x, E over y, M over z.
  if constexpr (M::axis_count == 3) {
    using T = gs::Sharded<D, M, "G:x S M:z">;
    using C = gs::Sharded<std::int32_t, M, "G:x E:y C">;
    using R = gs::Sharded<D, M, "G E C M">;
    const C ids = make_indices<C>(mesh, {3, 3, 2}, 4, 5);
    const R r = make<R>(mesh, {3, 3, 2, 3}, 11);
    auto f = [&](const T& t) {
      return gs::einsum<"GECM,GECM->">(gs::take_along<"S">(t, ids), r).eval();
    };
    CHECK(fd_relative_error(f, make<T>(mesh, {3, 4, 3}, 12)) < 1e-6);
  }
}

template <class M>
void scatter_along_cases(const M& mesh) {
  using D = double;
  // 1. The MoE combine: values "G:x E C M:y" -> "G:x S M:y", in place.
  {
    using X = gs::Sharded<D, M, "G:x E C M:y">;
    using C = gs::Sharded<std::int32_t, M, "G:x E C">;
    using R = gs::Sharded<D, M, "G S M">;
    const C ids = make_indices<C>(mesh, {3, 2, 2}, 5, 1);
    const R r = make<R>(mesh, {3, 5, 3}, 2);
    auto f = [&](const X& x) {
      return gs::einsum<"GSM,GSM->">(gs::scatter_add_along<"S", "G">(x, ids, 5), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 2, 2, 3}, 3)) < 1e-6);
  }
  // 2. E split over x: the result is pending over x and a tanh follows (the cotangent of the
  // scatter must be finished before its take_along); indices split otherwise; int64.
  {
    using X = gs::Sharded<D, M, "M:y G E:x C">;
    using C = gs::Sharded<std::int64_t, M, "G E C:y">;
    using R = gs::Sharded<D, M, "G S M">;
    const C ids = make_indices<C>(mesh, {2, 3, 2}, 4, 2);
    const R r = make<R>(mesh, {2, 4, 3}, 4);
    auto f = [&](const X& x) {
      auto s = gs::scatter_add_along<"S", "G">(x, ids, 4);
      return gs::einsum<"GSM,GSM->">(gs::tanh(s), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 2, 3, 2}, 5)) < 1e-6);
  }
  // 3. Pending partial values (K contracted over y), no batch label, trusted bounds.
  {
    using X = gs::Sharded<D, M, "E:x C M K:y">;
    using W = gs::Sharded<D, M, "K:y">;
    using C = gs::Sharded<std::int32_t, M, "E C">;
    using R = gs::Sharded<D, M, "S M">;
    const C ids = make_indices<C>(mesh, {3, 2}, 5, 3);
    const R r = make<R>(mesh, {5, 2}, 6);
    auto f = [&](const X& x, const W& w) {
      auto s =
          gs::scatter_add_along<"S">(gs::einsum<"ECMK,K->ECM">(x, w), ids, 5, gs::Bounds::trusted);
      return gs::einsum<"SM,SM->">(gs::sigmoid(s), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 2, 2, 3}, 7), make<W>(mesh, {3}, 8)) < 1e-6);
  }
  // 4. Dispatch, expert nonlinearity, combine (a MoE layer's data path): the gradient of the
  // tokens flows through scatter_add_along and take_along.
  {
    using T = gs::Sharded<D, M, "G:x S M:y">;
    using C = gs::Sharded<std::int32_t, M, "G:x E C">;
    using R = gs::Sharded<D, M, "G S M">;
    const C ids = make_indices<C>(mesh, {3, 2, 2}, 5, 4);
    const R r = make<R>(mesh, {3, 5, 3}, 9);
    auto f = [&](const T& t) {
      auto d = gs::take_along<"S">(t, ids);
      auto e = gs::scatter_add_along<"S", "G">(d * d, ids, 5);
      return gs::einsum<"GSM,GSM->">(e, r).eval();
    };
    CHECK(fd_relative_error(f, make<T>(mesh, {3, 5, 3}, 10)) < 1e-6);
  }
  if constexpr (M::axis_count == 3) {
    using X = gs::Sharded<D, M, "G:x E:y C M:z">;
    using C = gs::Sharded<std::int32_t, M, "G:x E:y C">;
    using R = gs::Sharded<D, M, "G S M">;
    const C ids = make_indices<C>(mesh, {3, 3, 2}, 4, 5);
    const R r = make<R>(mesh, {3, 4, 3}, 11);
    auto f = [&](const X& x) {
      return gs::einsum<"GSM,GSM->">(gs::scatter_add_along<"S", "G">(x, ids, 4), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 3, 2, 3}, 12)) < 1e-6);
  }
}

TEST_CASE("take_along gradients equal finite differences on every mesh") {
  on_every_mesh([](const auto& mesh) { take_along_cases(mesh); });
}

TEST_CASE("scatter_add_along gradients equal finite differences on every mesh") {
  on_every_mesh([](const auto& mesh) { scatter_along_cases(mesh); });
}

// The fast path's backward is local too: y = scatter_add_along(take_along(t)) * t equals
// count[g, s] * t^2 (count: how often s appears in ids[g, ...]), so dy/dt = 2 count t, and grad
// runs no collective.
TEST_CASE("the MoE fast path's backward runs no collective") {
  on_every_mesh([](const auto& mesh) {
    using M = std::remove_cvref_t<decltype(mesh)>;
    using T = gs::Sharded<double, M, "G:x*y S M">;
    using C = gs::Sharded<std::int32_t, M, "G:x*y E C">;
    const std::int64_t G = 5, S = 4, E = 2, Cn = 2, Md = 3;
    const C ids = make_indices<C>(mesh, {G, E, Cn}, S, 6);
    T t = make<T>(mesh, {G, S, Md}, 13);
    gs::track(t);
    const auto d = gs::take_along<"S">(t, ids, gs::Bounds::trusted);
    const auto e = gs::scatter_add_along<"S", "G">(d, ids, S, gs::Bounds::trusted);
    const T y = e * t;
    gs::comm_counters().reset();
    const auto [g] = gs::grad(y, t);
    CHECK(gs::comm_counters().total().calls == 0);
    const std::vector<std::int32_t> iv = ids.to_global();
    const std::vector<double> tv = t.to_global();
    const std::vector<double> gv = g.to_global();
    std::vector<double> want(tv.size(), 0.0);
    for (std::int64_t gi = 0; gi < G; ++gi)
      for (std::int64_t k = 0; k < E * Cn; ++k) {
        const std::int32_t s = iv[static_cast<std::size_t>(gi * E * Cn + k)];
        if (s < 0) continue;
        for (std::int64_t m = 0; m < Md; ++m) {
          const auto at = static_cast<std::size_t>((gi * S + s) * Md + m);
          want[at] += 2 * tv[at];
        }
      }
    double err = 0;
    for (std::size_t k = 0; k < want.size(); ++k) err = std::max(err, std::abs(gv[k] - want[k]));
    CHECK(err < 1e-12);
  });
}

}  // namespace
