// The backward of each collective, counted: a reshard's gradient runs the adjoint collective
// (AllToAll -> the reverse AllToAll, AllGather -> ReduceScatter when the cotangent comes back
// partial, finishing a partial sum -> a broadcast that moves nothing) and no other, with values
// against naive loops, on every 2-axis mesh shape with uneven sizes.
#include "mpi_test.hpp"
// clang-format off
// clang-format on

#include <algorithm>
#include <cmath>
#include <vector>

#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gshard::test::listed_mesh_shapes;
using gshard::test::make;
using gshard::test::world_size;
using M = gs::Mesh<"x", "y">;

gs::CommCount counted(gs::Collective kind) { return gs::comm_counters().get("x", kind); }

TEST_CASE("the backward of an AllToAll is the reverse AllToAll") {
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    using X = gs::Sharded<double, M, "E G:x M">;
    using Y = gs::Sharded<double, M, "E:x G M">;
    X x = make<X>(mesh, {5, 7, 3}, 1);
    const Y r = make<Y>(mesh, {5, 7, 3}, 2);
    gs::track(x);
    gs::comm_counters().reset();
    const Y y = gs::reshard<Y>(x);
    const gs::CommCount forward = counted(gs::Collective::all_to_all);
    const auto loss = gs::einsum<"EGM,EGM->">(y * y, r).eval();
    gs::comm_counters().reset();
    const auto [g] = gs::grad(loss, x);
    const gs::CommCount backward = counted(gs::Collective::all_to_all);
    CHECK(forward.calls == (s[0] > 1 ? 1 : 0));
    CHECK(backward.calls == forward.calls);
    CHECK(backward.bytes == forward.bytes);
    CHECK(gs::comm_counters().total().calls == backward.calls);
    const auto xv = x.to_global(), rv = r.to_global(), gv = g.to_global();
    double err = 0;
    for (std::size_t i = 0; i < xv.size(); ++i)
      err = std::max(err, std::abs(gv[i] - 2 * xv[i] * rv[i]));
    CHECK(err < 1e-12);
  }
}

TEST_CASE("the backward of an AllGather is a ReduceScatter when the cotangent is partial") {
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    using X = gs::Sharded<double, M, "B:x H">;
    using Y = gs::Sharded<double, M, "B H">;
    using W = gs::Sharded<double, M, "H K:x">;
    using R = gs::Sharded<double, M, "B K:x">;
    const int b = 7, h = 3, k = 5;
    X x = make<X>(mesh, {b, h}, 1);
    const W w = make<W>(mesh, {h, k}, 2);
    const R r = make<R>(mesh, {b, k}, 3);
    gs::track(x);
    gs::comm_counters().reset();
    const Y y = gs::reshard<Y>(x);  // AllGather over x
    CHECK(counted(gs::Collective::all_gather).calls == (s[0] > 1 ? 1 : 0));
    // y's cotangent is an einsum over K, which is split over x: partial over x. The gradient of
    // x, split over x, takes it by one ReduceScatter.
    const auto loss = gs::einsum<"BK,BK->">(gs::einsum<"BH,HK->BK">(y, w), r).eval();
    gs::comm_counters().reset();
    const auto [g] = gs::grad(loss, x);
    const gs::CommCount rs = counted(gs::Collective::reduce_scatter);
    CHECK(rs.calls == (s[0] > 1 ? 1 : 0));
    CHECK(gs::comm_counters().total().calls == rs.calls);
    const auto wv = w.to_global(), rv = r.to_global(), gv = g.to_global();
    double err = 0;
    for (int i = 0; i < b; ++i)
      for (int j = 0; j < h; ++j) {
        double e = 0;
        for (int l = 0; l < k; ++l) e += wv[j * k + l] * rv[i * k + l];
        err = std::max(err, std::abs(e - gv[i * h + j]));
      }
    CHECK(err < 1e-12);
  }
}

TEST_CASE("the backward of finishing a partial sum is a broadcast that moves nothing") {
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    using X = gs::Sharded<double, M, "B:x H">;
    using P = gs::Sharded<double, M, "H +x">;
    using V = gs::Sharded<double, M, "H">;
    const int b = 7, h = 3;
    X x = make<X>(mesh, {b, h}, 1);
    const V r = make<V>(mesh, {h}, 2);
    gs::track(x);
    gs::comm_counters().reset();
    const P p = gs::einsum<"BH->H">(x);
    const auto loss = gs::einsum<"H,H->">(gs::tanh(p), r).eval();  // tanh finishes p
    CHECK(counted(gs::Collective::all_reduce).calls == (s[0] > 1 ? 1 : 0));
    gs::comm_counters().reset();
    const auto [g] = gs::grad(loss, x);
    CHECK(gs::comm_counters().total().calls == 0);
    const auto xv = x.to_global(), rv = r.to_global(), gv = g.to_global();
    double err = 0;
    for (int j = 0; j < h; ++j) {
      double sum = 0;
      for (int i = 0; i < b; ++i) sum += xv[i * h + j];
      const double d = rv[j] * (1 - std::tanh(sum) * std::tanh(sum));
      for (int i = 0; i < b; ++i) err = std::max(err, std::abs(gv[i * h + j] - d));
    }
    CHECK(err < 1e-12);
  }
}

}  // namespace
