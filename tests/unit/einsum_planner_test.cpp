// The einsum planner's cost model (expr/contraction.hpp): C = A B with A "I:x K:y" and
// B "K:x J:y" (ScaLAPACK's 2-D block layout) on every listed mesh. For each shape the plan the
// layout rules give is also run by hand (explicit reshards to "I:x K" and "K J:y", then an einsum
// that moves nothing) as the reference the planner must beat or equal: the planner's values
// against a naive loop, its bytes (counters) never above the rules' plan and below it whenever
// explain says the planner chose, its local FLOPs never above, explain's byte counts equal to the
// counters, and gradients through a chosen plan against the analytic ones.
#include <cstdint>
#include <string>
#include <vector>

#include "grad_checks.hpp"
#include "mpi_test.hpp"

namespace {

namespace gs = gshard;
using gs::Shape;
using gshard::test::listed_mesh_shapes;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;
using M = gs::Mesh<"x", "y">;
using A = gs::Sharded<double, M, "I:x K:y">;
using B = gs::Sharded<double, M, "K:x J:y">;
using ARules = gs::Sharded<double, M, "I:x K">;
using BRules = gs::Sharded<double, M, "K J:y">;
using W = gs::Sharded<double, M, "I:x J:y">;  // at namespace scope: nvcc (docs/backends.md)

// Dyadic values: every sum below is exact in double.
std::vector<double> values(Int n, Int salt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (Int i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<double>((i * 37 + salt * 11) % 23 - 11) / 8.0;
  return v;
}

std::vector<double> naive(const std::vector<double>& a, const std::vector<double>& b, Int m, Int n,
                          Int k) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (Int i = 0; i < m; ++i)
    for (Int j = 0; j < n; ++j)
      for (Int q = 0; q < k; ++q)
        c[static_cast<std::size_t>(i * n + j)] +=
            a[static_cast<std::size_t>(i * k + q)] * b[static_cast<std::size_t>(q * n + j)];
  return c;
}

// The number before " bytes sent by this rank" in explain's first line.
Int header_bytes(const std::string& plan) {
  const std::string line = plan.substr(0, plan.find('\n'));
  const auto end = line.find(" bytes sent by this rank");
  const auto begin = line.rfind(' ', end - 1) + 1;
  return std::stoll(line.substr(begin, end - begin));
}

// The number after "instead of " in the planner's line.
Int rules_bytes_in(const std::string& plan) {
  const auto at = plan.find("instead of ") + 11;
  return std::stoll(plan.substr(at, plan.find(' ', at) - at));
}

struct Run {
  std::vector<double> c;
  Int bytes = 0;  // sent by this rank (counters)
  Int flops = 0;  // of this rank's local contractions
  std::string plan;
};

// C = A B by the planner, or by the rules' plan written out (reshards, then an einsum that moves
// nothing). Bytes and FLOPs up to the einsum's result; to_global's gather comes after.
Run multiply(const M& mesh, Int m, Int n, Int k, bool by_rules) {
  const A a = gs::from_global<A>(mesh, {m, k}, values(m * k, 1));
  const B b = gs::from_global<B>(mesh, {k, n}, values(k * n, 2));
  Run r;
  gs::comm_counters().reset();
  gs::flop_counters().reset();
  auto run = [&](const auto& x, const auto& y) {
    const auto e = gs::einsum<"IK,KJ->IJ">(x, y);
    r.plan = gs::explain(e);
    const auto c = e.eval();
    r.bytes = gs::comm_counters().total().bytes;
    r.flops = gs::flop_counters().contraction();
    r.c = c.to_global();
  };
  if (by_rules)
    run(gs::reshard<ARules>(a), gs::reshard<BRules>(b));
  else
    run(a, b);
  return r;
}

}  // namespace

TEST_CASE("planner: values against a naive loop, bytes and FLOPs against the rules' plan") {
  struct Case {
    Int m, n, k;
    bool even;
  };
  // Big A, small B and C (A should stay), square, tall C (the rules' plan), and uneven ones.
  const std::vector<Case> cases{{256, 8, 256, true},  {64, 64, 64, true},  {64, 64, 8, true},
                                {253, 5, 259, false}, {37, 29, 31, false}, {9, 3, 70, false}};
  int chosen = 0;
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    for (const auto& cs : cases) {
      INFO("mesh " << s[0] << "x" << s[1] << ", m n k " << cs.m << " " << cs.n << " " << cs.k);
      const auto expect = naive(values(cs.m * cs.k, 1), values(cs.k * cs.n, 2), cs.m, cs.n, cs.k);
      const Run p = multiply(mesh, cs.m, cs.n, cs.k, false);
      const Run r = multiply(mesh, cs.m, cs.n, cs.k, true);
      CHECK(p.c == expect);
      CHECK(r.c == expect);
      CHECK(r.plan.find("planner:") == std::string::npos);  // nothing left to move
      const bool planned = p.plan.find("planner:") != std::string::npos;
      chosen += planned ? 1 : 0;
      CHECK(p.flops <= r.flops);
      if (!cs.even)
        continue;  // byte counts per rank differ on uneven blocks; the model is rank 0's
      CHECK(header_bytes(p.plan) == p.bytes);
      if (planned) {
        CHECK(p.bytes < r.bytes);
        if (world_rank() == 0) CHECK(rules_bytes_in(p.plan) == r.bytes);
      } else {
        CHECK(p.bytes == r.bytes);
      }
    }
    // With A the biggest operand and K split over y, keeping A in place is cheaper.
    if (s[1] > 1) {
      const Run p = multiply(mesh, 256, 8, 256, false);
      CHECK(p.plan.find("planner:") != std::string::npos);
      CHECK(p.plan.find("ReduceScatter over y") != std::string::npos);
    }
  }
  if (world_size() > 1) CHECK(chosen > 0);
}

TEST_CASE("planner: gradients through a chosen plan against the analytic ones") {
  // loss = sum(C * W): dA = W B^T, dB = A^T W, by naive loops.
  const Int m = 253, n = 7, k = 259;
  const auto va = values(m * k, 1), vb = values(k * n, 2), vw = values(m * n, 3);
  std::vector<double> da(static_cast<std::size_t>(m * k), 0.0),
      db(static_cast<std::size_t>(k * n), 0.0);
  for (Int i = 0; i < m; ++i)
    for (Int j = 0; j < n; ++j)
      for (Int q = 0; q < k; ++q) {
        const double w = vw[static_cast<std::size_t>(i * n + j)];
        da[static_cast<std::size_t>(i * k + q)] += w * vb[static_cast<std::size_t>(q * n + j)];
        db[static_cast<std::size_t>(q * n + j)] += va[static_cast<std::size_t>(i * k + q)] * w;
      }
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    INFO("mesh " << s[0] << "x" << s[1]);
    const W w = gs::from_global<W>(mesh, {m, n}, vw);
    A a = gs::from_global<A>(mesh, {m, k}, va);
    B b = gs::from_global<B>(mesh, {k, n}, vb);
    if (s[1] > 1)
      CHECK(gs::explain(gs::einsum<"IK,KJ->IJ">(a, b)).find("planner:") != std::string::npos);
    gs::track(std::tie(a, b));
    const auto loss = gs::einsum<"IJ,IJ->">(gs::einsum<"IK,KJ->IJ">(a, b), w).eval();
    const auto [ga, gb] = gs::grad(loss, std::tie(a, b));
    CHECK(ga.to_global() == da);
    CHECK(gb.to_global() == db);
  }
}
