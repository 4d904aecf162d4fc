// Gradients of layer_norm, rms_norm (with and without gain and bias, and eps), cumsum,
// exclusive_cumsum and top_k against central finite differences in double, on every listed mesh
// shape, uneven sizes, the op's label split wherever the op allows it, with cotangents that
// arrive still partial over an axis, inputs with pending partial sums, and parameters read in
// another split than the input's.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/ops/normalize.hpp>
#include <gshard/ops/scan.hpp>
#include <gshard/ops/topk.hpp>
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "block_reference.hpp"
#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gshard::test::fd_relative_error;
using gshard::test::listed_mesh_shapes;
using gshard::test::make;
using gshard::test::on_every_mesh;
using gshard::test::world_size;

constexpr double tolerance = 1e-6;

using D = double;

// layer_norm and rms_norm over a split label (B over y), each public overload.
template <class M>
void norm_cases(const M& mesh) {
  using X = gs::Sharded<D, M, "A:x B:y">;
  using G = gs::Sharded<D, M, "B">;     // replicated: resharded to B's split
  using GX = gs::Sharded<D, M, "B:x">;  // split otherwise: resharded too
  const X r = make<X>(mesh, {5, 7}, 40);
  auto loss = [&](const X& y) { return gs::einsum<"AB,AB->">(y, r).eval(); };
  {
    INFO("layer_norm(x)");
    auto f = [&](const X& x) { return loss(gs::layer_norm<"B">(x)); };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 1)) < tolerance);
  }
  {
    INFO("layer_norm(x, eps) with a large eps");
    auto f = [&](const X& x) { return loss(gs::layer_norm<"B">(x, 0.5)); };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 2)) < tolerance);
  }
  {
    INFO("layer_norm(x, gain)");
    auto f = [&](const X& x, const G& g) { return loss(gs::layer_norm<"B">(x, g)); };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 3), make<G>(mesh, {7}, 4)) < tolerance);
  }
  {
    INFO("layer_norm(x, gain, bias, eps)");
    auto f = [&](const X& x, const G& g, const GX& b) {
      return loss(gs::layer_norm<"B">(x, g, b, 0.1));
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 5), make<G>(mesh, {7}, 6),
                            make<GX>(mesh, {7}, 7)) < tolerance);
  }
  {
    INFO("rms_norm(x) and rms_norm(x, eps)");
    auto f = [&](const X& x) {
      return loss(X(gs::rms_norm<"B">(x) + gs::rms_norm<"B">(x * 0.5, 0.3) * 2.0));
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 8)) < tolerance);
  }
  {
    INFO("rms_norm(x, gain, eps)");
    auto f = [&](const X& x, const GX& g) { return loss(gs::rms_norm<"B">(x, g, 0.2)); };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 9), make<GX>(mesh, {7}, 10)) < tolerance);
  }
}

// The input a pending partial sum (K over y contracted), the label over x; the result's
// cotangent partial over y (C over y contracted in the loss).
template <class M>
void norm_partial_cases(const M& mesh) {
  using P = gs::Sharded<D, M, "A K:y">;
  using W = gs::Sharded<D, M, "K:y B:x">;
  using Y = gs::Sharded<D, M, "A B:x">;
  using G = gs::Sharded<D, M, "B:x">;
  using V = gs::Sharded<D, M, "B C:y">;
  using R = gs::Sharded<D, M, "A C:y">;
  const V v = make<V>(mesh, {5, 3}, 41);
  const R r = make<R>(mesh, {3, 3}, 42);
  auto loss = [&](const Y& y) {
    return gs::einsum<"AC,AC->">(gs::einsum<"AB,BC->AC">(y, v), r).eval();
  };
  {
    INFO("layer_norm of a pending sum, gain and bias");
    auto f = [&](const P& p, const W& w, const G& g, const G& b) {
      return loss(gs::layer_norm<"B">(gs::einsum<"AK,KB->AB">(p, w), g, b));
    };
    CHECK(fd_relative_error(f, make<P>(mesh, {3, 3}, 11), make<W>(mesh, {3, 5}, 12),
                            make<G>(mesh, {5}, 13), make<G>(mesh, {5}, 14)) < tolerance);
  }
  {
    INFO("rms_norm of a pending sum, gain");
    auto f = [&](const P& p, const W& w, const G& g) {
      return loss(gs::rms_norm<"B">(gs::einsum<"AK,KB->AB">(p, w), g));
    };
    CHECK(fd_relative_error(f, make<P>(mesh, {3, 3}, 15), make<W>(mesh, {3, 5}, 16),
                            make<G>(mesh, {5}, 17)) < tolerance);
  }
}

// cumsum and exclusive_cumsum over S split on one axis, on two axes in mesh order and in the
// other order (the gathered fallback), and over a pending partial sum.
template <class M>
void scan_cases(const M& mesh) {
  {
    using X = gs::Sharded<D, M, "A:x S:y">;
    const X r = make<X>(mesh, {3, 7}, 43);
    auto f = [&](const X& x) {
      return gs::einsum<"AS,AS->">(gs::cumsum<"S">(x) + gs::exclusive_cumsum<"S">(x * x), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 7}, 18)) < tolerance);
  }
  {
    using X = gs::Sharded<D, M, "S:x*y A">;
    using XR = gs::Sharded<D, M, "S:y*x A">;
    const X r = make<X>(mesh, {11, 2}, 44);
    auto f = [&](const X& x, const XR& xr) {
      X y = gs::cumsum<"S">(x) + gs::exclusive_cumsum<"S">(gs::reshard<X>(gs::cumsum<"S">(xr)));
      return gs::einsum<"SA,SA->">(y, r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {11, 2}, 19), make<XR>(mesh, {11, 2}, 20)) <
          tolerance);
  }
  {
    // A pending input (K over y) scanned over S split on x; the loss contracts C over y, so the
    // scan's cotangent is partial over y too.
    using P = gs::Sharded<D, M, "A K:y">;
    using W = gs::Sharded<D, M, "K:y S:x">;
    using V = gs::Sharded<D, M, "S C:y">;
    using R = gs::Sharded<D, M, "A C:y">;
    const V v = make<V>(mesh, {5, 3}, 45);
    const R r = make<R>(mesh, {3, 3}, 46);
    auto f = [&](const P& p, const W& w) {
      auto s = gs::exclusive_cumsum<"S">(gs::cumsum<"S">(gs::einsum<"AK,KS->AS">(p, w)));
      return gs::einsum<"AC,AC->">(gs::einsum<"AS,SC->AC">(s, v), r).eval();
    };
    CHECK(fd_relative_error(f, make<P>(mesh, {3, 3}, 21), make<W>(mesh, {3, 5}, 22)) < tolerance);
  }
}

// top_k's values over S split (one axis, two axes), k = 1, some, all; a pending input; a
// values cotangent partial over S's axis.
template <class M>
void top_k_cases(const M& mesh) {
  {
    using X = gs::Sharded<D, M, "A:x S:y">;
    using R = gs::Sharded<D, M, "A:x K">;
    for (std::int64_t k : {1, 3, 7}) {
      INFO("k = " << k);
      const R r = make<R>(mesh, {5, k}, 47);
      auto f = [&](const X& x) {
        return gs::einsum<"AK,AK->">(gs::top_k<"S", "K">(x * 1.0, k).values, r).eval();
      };
      CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 23)) < tolerance);
    }
  }
  {
    using X = gs::Sharded<D, M, "S:x*y A">;
    using R = gs::Sharded<D, M, "K A">;
    const R r = make<R>(mesh, {4, 2}, 48);
    auto f = [&](const X& x) {
      const auto t = gs::top_k<"S", "K">(x, 4);
      return gs::einsum<"KA,KA->">(gs::tanh(t.values), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {11, 2}, 24)) < tolerance);
  }
  {
    // S split over y (a pending sum reduce-scattered there); the values "A J" are replicated
    // over y and the loss contracts C over y, so their cotangent arrives partial over y, the
    // axis that splits S: the backward finishes it before scattering.
    using P = gs::Sharded<D, M, "A Q:y">;
    using W = gs::Sharded<D, M, "Q:y S">;
    using V = gs::Sharded<D, M, "J C:y">;
    using R = gs::Sharded<D, M, "A C:y">;
    const V v = make<V>(mesh, {2, 3}, 49);
    const R r = make<R>(mesh, {3, 3}, 50);
    auto f = [&](const P& p, const W& w) {
      using S = gs::Sharded<D, M, "A S:y">;
      const S s = gs::einsum<"AQ,QS->AS">(p, w);
      const auto t = gs::top_k<"S", "J">(s, 2);
      return gs::einsum<"AC,AC->">(gs::einsum<"AJ,JC->AC">(t.values, v), r).eval();
    };
    CHECK(fd_relative_error(f, make<P>(mesh, {3, 3}, 25), make<W>(mesh, {3, 6}, 26)) < tolerance);
  }
}

TEST_CASE("layer_norm and rms_norm gradients equal finite differences on every mesh") {
  on_every_mesh([](const auto& mesh) { norm_cases(mesh); });
}

TEST_CASE("layer_norm and rms_norm gradients of pending inputs, with partial cotangents") {
  on_every_mesh([](const auto& mesh) { norm_partial_cases(mesh); });
}

TEST_CASE("cumsum and exclusive_cumsum gradients equal finite differences on every mesh") {
  on_every_mesh([](const auto& mesh) { scan_cases(mesh); });
}

TEST_CASE("top_k values gradients equal finite differences on every mesh") {
  on_every_mesh([](const auto& mesh) { top_k_cases(mesh); });
}

TEST_CASE("top_k's gradient lands on the chosen positions only; indices never record") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  using X = gs::Sharded<D, M, "A S:y">;
  using R = gs::Sharded<D, M, "A K">;
  X x = make<X>(mesh, {2, 9}, 27);
  const R r = make<R>(mesh, {2, 2}, 51);
  gs::track(x);
  const auto t = gs::top_k<"S", "K">(x, 2);
  const auto [g] = gs::grad(gs::einsum<"AK,AK->">(t.values, r).eval(), x);
  const auto xv = x.to_global(), gv = g.to_global(), rv = r.to_global();
  // The naive reference: the two largest of each row get r's entries, in order.
  std::vector<double> want(xv.size(), 0.0);
  for (int a = 0; a < 2; ++a) {
    std::vector<int> order(9);
    for (int i = 0; i < 9; ++i) order[static_cast<std::size_t>(i)] = i;
    std::sort(order.begin(), order.end(), [&](int i, int j) {  // ties by position
      const double xi = xv[static_cast<std::size_t>(a * 9 + i)];
      const double xj = xv[static_cast<std::size_t>(a * 9 + j)];
      return xi > xj || (xi == xj && i < j);
    });
    for (int j = 0; j < 2; ++j)
      want[static_cast<std::size_t>(a * 9 + order[static_cast<std::size_t>(j)])] =
          rv[static_cast<std::size_t>(a * 2 + j)];
  }
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(gv[i] == want[i]);
  CHECK(t.indices.grad_node() == nullptr);
}

// grad() of each op alone on a mesh whose y axis (all ranks) splits the label, A = 3 rows:
// layer_norm ONE AllReduce of the two row sums (2 x 3 doubles); cumsum ONE AllGather of the 3
// shard totals; top_k nothing.
TEST_CASE("backward communication over a split label, counted") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  using X = gs::Sharded<D, M, "A S:y">;
  const X r = make<X>(mesh, {3, 10}, 52);
  const std::int64_t k = n;
  auto grad_comms = [&](const auto& loss, const X& x) {
    gs::comm_counters().reset();
    (void)gs::grad(loss, x);
    return gs::comm_counters();
  };
  {
    X x = make<X>(mesh, {3, 10}, 28);
    gs::track(x);
    const auto c = grad_comms(gs::einsum<"AS,AS->">(gs::layer_norm<"S">(x, 0.1), r).eval(), x);
    const auto ar = c.get("y", gs::Collective::all_reduce);
    CHECK(ar.calls == (n > 1 ? 1 : 0));
    CHECK(ar.bytes == 2 * (k - 1) * (2 * 3 * 8) / k);
    CHECK(c.total().calls == ar.calls);
  }
  {
    X x = make<X>(mesh, {3, 10}, 29);
    gs::track(x);
    const auto c = grad_comms(gs::einsum<"AS,AS->">(gs::cumsum<"S">(x), r).eval(), x);
    const auto ag = c.get("y", gs::Collective::all_gather);
    CHECK(ag.calls == (n > 1 ? 1 : 0));
    CHECK(ag.bytes == (k - 1) * 3 * 8);
    CHECK(c.total().calls == ag.calls);
  }
  {
    using R = gs::Sharded<D, M, "A K">;
    const R rk = make<R>(mesh, {3, 4}, 53);
    X x = make<X>(mesh, {3, 10}, 30);
    gs::track(x);
    const auto c =
        grad_comms(gs::einsum<"AK,AK->">(gs::top_k<"S", "K">(x, 4).values, rk).eval(), x);
    CHECK(c.total().calls == 0);
  }
}

}  // namespace
