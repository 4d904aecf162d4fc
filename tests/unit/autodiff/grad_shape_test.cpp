// Gradients of the shape ops (ops/shape.hpp): merge, split, slice, pad, concat against central
// finite differences in double, on every listed mesh shape, with sizes uneven w.r.t. the axes,
// the op's label split (also differently in operand and result, and over several axes), operands
// that must be resharded first, pending partial sums, identity slices and pads, and each op's
// options. Each loss is the full contraction of the op's output with a fixed tensor, so every
// output element matters. Also: the backward of a split-label slice moves data only within the
// line's group (no gathering), and integer shape ops never record.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/ops/reduce.hpp>
#include <gshard/ops/shape.hpp>
// clang-format on

#include <cstdint>
#include <string>
#include <vector>

#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gs::Shape;
using gshard::test::fd_relative_error;
using gshard::test::listed_mesh_shapes;
using gshard::test::make;
using gshard::test::world_size;
using D = double;
// One mesh type for every shape (compile time): a 2-axis shape a x b is the mesh a x b x 1, the
// same ranks in the same places; the 2x2x2 shape uses z.
using M = gs::Mesh<"x", "y", "z">;

void merge_split_cases(const M& mesh) {
  // merge of two labels both split: the merged label over x*y.
  {
    using X = gs::Sharded<D, M, "G:x S:y C">;
    using R = gs::Sharded<D, M, "T C">;
    const R r = make<R>(mesh, {15, 2}, 1);
    auto f = [&](const X& x) { return gs::einsum<"TC,TC->">(gs::merge<"GS", "T">(x), r).eval(); };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 5, 2}, 2)) < 1e-6);
  }
  // merge of labels out of memory order (a reshard to staging first), into one of them, and of
  // three labels; all from one tracked input, so their cotangents add up.
  {
    using X = gs::Sharded<D, M, "S:x C G:y">;
    using R1 = gs::Sharded<D, M, "T C:y">;
    using R2 = gs::Sharded<D, M, "S C">;
    const R1 r1 = make<R1>(mesh, {15, 2}, 3);
    const R2 r2 = make<R2>(mesh, {5, 6}, 4);
    const gs::Sharded<D, M, "U"> r3 = make<gs::Sharded<D, M, "U">>(mesh, {30}, 5);
    auto f = [&](const X& x) {
      return (gs::einsum<"TC,TC->">(gs::merge<"GS", "T">(x), r1) +
              gs::einsum<"SC,SC->">(gs::merge<"CG", "C">(x), r2) +
              gs::einsum<"U,U->">(gs::merge<"GSC", "U">(x), r3))
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 2, 3}, 6)) < 1e-6);
  }
  // split of a split label (uneven), into three labels, and into the label itself.
  {
    using X = gs::Sharded<D, M, "T:x C:y">;
    using R1 = gs::Sharded<D, M, "G S C">;
    using R2 = gs::Sharded<D, M, "A B E C:x">;
    using R3 = gs::Sharded<D, M, "T S:y C">;
    const R1 r1 = make<R1>(mesh, {5, 3, 3}, 7);
    const R2 r2 = make<R2>(mesh, {3, 1, 5, 3}, 8);
    const R3 r3 = make<R3>(mesh, {3, 5, 3}, 9);
    auto f = [&](const X& x) {
      return (gs::einsum<"GSC,GSC->">(gs::split<"T", "GS">(x, {5, 3}), r1) +
              gs::einsum<"ABEC,ABEC->">(gs::split<"T", "ABE">(x, {3, 1, 5}), r2) +
              gs::einsum<"TSC,TSC->">(gs::split<"T", "TS">(x, {3, 5}), r3))
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {15, 3}, 10)) < 1e-6);
  }
  // split of a label replicated over every axis, then merged back (a round trip) under tanh.
  {
    using X = gs::Sharded<D, M, "C:y T">;
    using R = gs::Sharded<D, M, "C:x T">;
    const R r = make<R>(mesh, {3, 14}, 11);
    auto f = [&](const X& x) {
      auto s = gs::split<"T", "PQ">(x, {7, 2});
      auto m = gs::merge<"PQ", "T">(gs::tanh(s).eval());
      return gs::einsum<"CT,CT->">(m, r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 14}, 12)) < 1e-6);
  }
}

void slice_pad_cases(const M& mesh) {
  // slice of a split label (uneven), the identity slice, and a one-element slice at the end.
  {
    using X = gs::Sharded<D, M, "A:y S:x">;
    using R = gs::Sharded<D, M, "A S">;
    const R r1 = make<R>(mesh, {3, 5}, 13);
    const R r2 = make<R>(mesh, {3, 9}, 14);
    const R r3 = make<R>(mesh, {3, 1}, 15);
    auto f = [&](const X& x) {
      return (gs::einsum<"AS,AS->">(gs::slice<"S">(x, 2, 7), r1) +
              gs::einsum<"AS,AS->">(gs::slice<"S">(x, 0, 9), r2) +
              gs::einsum<"AS,AS->">(gs::slice<"S">(x, 8, 9), r3))
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 9}, 16)) < 1e-6);
  }
  // slice of a lazy expression whose value holds pending partial sums (K over y).
  {
    using W = gs::Sharded<D, M, "S:x K:y">;
    using V = gs::Sharded<D, M, "K A">;
    using R = gs::Sharded<D, M, "S A">;
    const R r = make<R>(mesh, {4, 2}, 17);
    auto f = [&](const W& w, const V& v) {
      return gs::einsum<"SA,SA->">(gs::slice<"S">(gs::einsum<"SK,KA->SA">(w, v), 1, 5), r).eval();
    };
    CHECK(fd_relative_error(f, make<W>(mesh, {7, 5}, 18), make<V>(mesh, {5, 2}, 19)) < 1e-6);
  }
  // pad of a split label with a value, with the default zero on one side only, and identity.
  {
    using X = gs::Sharded<D, M, "S:x A:y">;
    using R1 = gs::Sharded<D, M, "S A">;
    using R2 = gs::Sharded<D, M, "S:y A">;
    const R1 r1 = make<R1>(mesh, {10, 3}, 20);
    const R2 r2 = make<R2>(mesh, {7, 3}, 21);
    const R1 r3 = make<R1>(mesh, {5, 3}, 22);
    auto f = [&](const X& x) {
      return (gs::einsum<"SA,SA->">(gs::pad<"S">(x, 2, 3, 0.5), r1) +
              gs::einsum<"SA,SA->">(gs::pad<"S">(x, 0, 2), r2) +
              gs::einsum<"SA,SA->">(gs::pad<"S">(x * x, 0, 0, 1.5), r3))
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 3}, 23)) < 1e-6);
  }
  // pad then slice back a different window, under a nonlinearity.
  {
    using X = gs::Sharded<D, M, "A S:y">;
    using R = gs::Sharded<D, M, "A S:x">;
    const R r = make<R>(mesh, {2, 6}, 24);
    auto f = [&](const X& x) {
      auto p = gs::pad<"S">(gs::sigmoid(x), 3, 1, -0.25);
      return gs::einsum<"AS,AS->">(gs::slice<"S">(gs::exp(p).eval(), 1, 7), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {2, 5}, 25)) < 1e-6);
  }
}

void concat_cases(const M& mesh) {
  // Three operands split differently along S (x, y, replicated), one of them with other labels
  // in another order and split (resharded before the exchange).
  {
    using A = gs::Sharded<D, M, "S:x B:y">;
    using B = gs::Sharded<D, M, "B S:y">;
    using C = gs::Sharded<D, M, "S B">;
    using R = gs::Sharded<D, M, "S B">;
    const R r = make<R>(mesh, {10, 2}, 26);
    auto f = [&](const A& a, const B& b, const C& c) {
      return gs::einsum<"SB,SB->">(gs::concat<"S">(a, b, c), r).eval();
    };
    CHECK(fd_relative_error(f, make<A>(mesh, {3, 2}, 27), make<B>(mesh, {2, 5}, 28),
                            make<C>(mesh, {2, 2}, 29)) < 1e-6);
  }
  // The first operand holds pending partial sums (K over x): the result is partial too, and the
  // second operand (split over x along S) is added as one copy of the sum.
  {
    using W = gs::Sharded<D, M, "S:y K:x">;
    using B = gs::Sharded<D, M, "S:x">;
    using R = gs::Sharded<D, M, "S:y">;
    const R r = make<R>(mesh, {9}, 30);
    auto f = [&](const W& w, const B& b) {
      auto s = gs::sum<"K">(w);  // "S:y +x"
      return gs::einsum<"S,S->">(gs::concat<"S">(s, gs::tanh(b)), r).eval();
    };
    CHECK(fd_relative_error(f, make<W>(mesh, {4, 3}, 31), make<B>(mesh, {5}, 32)) < 1e-6);
  }
  // The same tensor twice, and a lazy operand.
  {
    using A = gs::Sharded<D, M, "S:x">;
    using R = gs::Sharded<D, M, "S:y">;
    const R r = make<R>(mesh, {10}, 33);
    auto f = [&](const A& a) { return gs::einsum<"S,S->">(gs::concat<"S">(a, a * a), r).eval(); };
    CHECK(fd_relative_error(f, make<A>(mesh, {5}, 34)) < 1e-6);
  }
  {
    // Labels over several axes: operands split over x*z and z along S.
    using A = gs::Sharded<D, M, "S:x*z B">;
    using B = gs::Sharded<D, M, "S:z B:y">;
    using R = gs::Sharded<D, M, "S B:x">;
    const R r = make<R>(mesh, {8, 2}, 35);
    auto f = [&](const A& a, const B& b) {
      return gs::einsum<"SB,SB->">(gs::slice<"S">(gs::concat<"S">(a, b), 1, 9), r).eval();
    };
    CHECK(fd_relative_error(f, make<A>(mesh, {5, 2}, 36), make<B>(mesh, {4, 2}, 37)) < 1e-6);
  }
}

// Every op in one chain whose cotangents arrive still partial over y (the contraction over K
// split on y in the einsum's backward), each op's label split over x.
void chain_cases(const M& mesh) {
  using X = gs::Sharded<D, M, "S:x C">;
  using W = gs::Sharded<D, M, "U K:y">;
  using R = gs::Sharded<D, M, "P K:y">;
  const R r = make<R>(mesh, {4, 3}, 38);
  auto f = [&](const X& x, const W& w) {
    auto b = gs::pad<"S">(gs::slice<"S">(x, 1, 5), 1, 2, 0.3);     // 7
    auto d = gs::split<"S", "PQ">(gs::concat<"S">(b, x), {4, 3});  // "P:x Q C"
    auto e = gs::merge<"QC", "U">(d);                              // "P:x U"
    return gs::einsum<"PK,PK->">(gs::tanh(gs::einsum<"PU,UK->PK">(e, w)), r).eval();
  };
  CHECK(fd_relative_error(f, make<X>(mesh, {5, 2}, 39), make<W>(mesh, {6, 3}, 44)) < 1e-6);
}

M mesh_of(const std::vector<int>& s) {
  return M(MPI_COMM_WORLD, {s[0], s[1], s.size() > 2 ? s[2] : 1});
}

template <class F>
void on_every_mesh(F cases) {
  for (const auto& s : listed_mesh_shapes(world_size())) {
    INFO("mesh " << gshard::test::sizes_text(s));
    cases(mesh_of(s));
  }
}

TEST_CASE("merge and split: gradients equal central finite differences on every mesh") {
  on_every_mesh([](const M& mesh) { merge_split_cases(mesh); });
}

TEST_CASE("slice and pad: gradients equal central finite differences on every mesh") {
  on_every_mesh([](const M& mesh) { slice_pad_cases(mesh); });
}

TEST_CASE("concat: gradients equal central finite differences on every mesh") {
  on_every_mesh([](const M& mesh) { concat_cases(mesh); });
}

TEST_CASE("a chain of every shape op with partial cotangents: finite differences, every mesh") {
  on_every_mesh([](const M& mesh) { chain_cases(mesh); });
}

TEST_CASE("the backward of a split-label slice is one exchange over the line's axis") {
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh = mesh_of(s);
    using X = gs::Sharded<D, M, "A:y S:x">;
    using R = gs::Sharded<D, M, "A:y S:x">;
    X x = make<X>(mesh, {3, 11}, 40);
    const R r = make<R>(mesh, {3, 8}, 41);
    gs::track(x);
    const auto loss = gs::einsum<"AS,AS->">(gs::slice<"S">(x, 1, 9), r).eval();
    gs::comm_counters().reset();
    const auto [g] = gs::grad(loss, x);
    // The einsum's backward needs no communication (r shares the slice's layout); the pad back
    // is one AllToAllv over x (with x > 1 the blocks of [1, 9) and of S never line up).
    const auto& c = gs::comm_counters();
    const auto moved = c.get("x", gs::Collective::all_to_all_v);
    CHECK(moved.calls == (s[0] > 1 ? 1 : 0));
    CHECK(c.total().calls == moved.calls);
    const auto gv = g.to_global(), rv = r.to_global();
    for (int a = 0; a < 3; ++a)
      for (int i = 0; i < 11; ++i) {
        const double want = i >= 1 && i < 9 ? rv[static_cast<std::size_t>(a * 8 + i - 1)] : 0.0;
        CHECK(gv[static_cast<std::size_t>(a * 11 + i)] == want);
      }
  }
}

TEST_CASE("shape ops record nothing for integers or under NoGrad, and no node for plain inputs") {
  const M mesh(MPI_COMM_WORLD, {world_size(), 1, 1});
  using I = gs::Sharded<std::int64_t, M, "S:x A">;
  using X = gs::Sharded<D, M, "S:x A">;
  const I i = gs::from_global<I>(mesh, {4, 2}, std::vector<std::int64_t>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(!gs::concat<"S">(gs::slice<"S">(i, 1, 3), gs::pad<"S">(i, 1, 0)).grad_node());
  CHECK(!gs::merge<"PQ", "T">(gs::split<"S", "PQ">(i, {2, 2})).grad_node());
  X x = make<X>(mesh, {4, 2}, 42);
  const X plain = make<X>(mesh, {4, 2}, 43);
  CHECK(!gs::slice<"S">(plain, 0, 4).grad_node());
  CHECK(!gs::pad<"S">(plain, 0, 0).grad_node());
  gs::track(x);
  CHECK(gs::slice<"S">(x, 0, 4).grad_node());
  CHECK(gs::concat<"S">(plain, x).grad_node());
  gs::NoGrad off;
  CHECK(!gs::slice<"S">(x, 0, 4).grad_node());
  CHECK(!gs::pad<"S">(x, 0, 0).grad_node());
  CHECK(!gs::merge<"SA", "T">(x).grad_node());
}

}  // namespace
