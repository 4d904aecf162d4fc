// Gradients of the index ops (take, embedding, scatter_add: w.r.t. the table / the values) and
// of the random ops (dropout, uniform_noise; random_*_like carry none) against central finite
// differences in double, on every listed mesh shape, with sizes uneven w.r.t. the axes, the
// indexed label split whenever the rules allow it, pending partial inputs, repeated and unused
// indices; loss = einsum of the op's output with a fixed random tensor.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/ops/index.hpp>
#include <gshard/ops/random.hpp>
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "block_reference.hpp"
#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gs::Shape;
using gshard::test::fd_relative_error;
using gshard::test::listed_mesh_shapes;
using gshard::test::make;
using gshard::test::mesh_of;
using gshard::test::on_every_mesh;
using gshard::test::world_size;

// Indices in [0, n) with repeats (i * 5 + salt mod n), so gradients accumulate; some values of
// [0, n) stay unused when the count is small.
template <class C>
C make_indices(const typename C::mesh_type& mesh, const Shape& shape, std::int64_t n,
               unsigned salt) {
  using I = typename C::value_type;
  std::int64_t count = 1;
  for (auto s : shape) count *= s;
  std::vector<I> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<I>((static_cast<std::int64_t>(i) * 5 + salt) % n);
  return gs::from_global<C>(mesh, shape, v);
}

template <class M>
void index_cases(const M& mesh) {
  using D = double;
  // 1. Embedding lookup, Megatron style: V split (over y), ids replicated, so the result is a
  // pending sum over y and the gradient lands in each rank's vocabulary shard; M split over x.
  {
    using T = gs::Sharded<D, M, "V:y M:x">;
    using C = gs::Sharded<std::int32_t, M, "B S">;
    using R = gs::Sharded<D, M, "B S M">;
    const C ids = make_indices<C>(mesh, {3, 4}, 7, 1);
    const R r = make<R>(mesh, {3, 4, 5}, 2);
    auto f = [&](const T& t) {
      return gs::einsum<"BSM,BSM->">(gs::embedding<"V">(t, ids), r).eval();
    };
    CHECK(fd_relative_error(f, make<T>(mesh, {7, 5}, 3)) < 1e-6);
  }
  // 2. take with the ids split over the table's V axis (x): the table is gathered over V, the
  // gradient is partial over x and reduce-scattered home; table "M V" (V not first), int64.
  {
    using T = gs::Sharded<D, M, "M:y V:x">;
    using C = gs::Sharded<std::int64_t, M, "B:x">;
    using R = gs::Sharded<D, M, "B M">;
    const C ids = make_indices<C>(mesh, {5}, 6, 2);
    const R r = make<R>(mesh, {5, 3}, 4);
    auto f = [&](const T& t) { return gs::einsum<"BM,BM->">(gs::take<"V">(t, ids), r).eval(); };
    CHECK(fd_relative_error(f, make<T>(mesh, {3, 6}, 5)) < 1e-6);
  }
  // 3. A pending partial table (K contracted over y) looked up by ids split over x, V over x too,
  // then a nonlinearity (the cotangent of take must be finished where needed).
  {
    using A = gs::Sharded<D, M, "V:x K:y M">;
    using W = gs::Sharded<D, M, "K:y">;
    using C = gs::Sharded<std::int32_t, M, "B S:x">;
    using R = gs::Sharded<D, M, "B S M">;
    const C ids = make_indices<C>(mesh, {2, 5}, 5, 3);
    const R r = make<R>(mesh, {2, 5, 3}, 6);
    auto f = [&](const A& a, const W& w) {
      auto t = gs::take<"V">(gs::einsum<"VKM,K->VM">(a, w), ids);
      return gs::einsum<"BSM,BSM->">(gs::tanh(t), r).eval();
    };
    CHECK(fd_relative_error(f, make<A>(mesh, {5, 3, 3}, 7), make<W>(mesh, {3}, 8)) < 1e-6);
  }
  // 4. scatter_add: values split over x (B) and y (M), ids split like the values' B; n larger
  // than every index (rows of the result no index reaches get no gradient).
  {
    using X = gs::Sharded<D, M, "B:x S M:y">;
    using C = gs::Sharded<std::int32_t, M, "B:x S">;
    using R = gs::Sharded<D, M, "V M">;
    const C ids = make_indices<C>(mesh, {3, 2}, 5, 4);
    const R r = make<R>(mesh, {7, 5}, 9);
    auto f = [&](const X& x) {
      return gs::einsum<"VM,VM->">(gs::scatter_add<"V">(x, ids, 7), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 2, 5}, 10)) < 1e-6);
  }
  // 5. scatter_add of pending partial values (K contracted over y), index labels not first in
  // the values and ids split differently from the values, then a nonlinearity.
  {
    using X = gs::Sharded<D, M, "M S K:y">;
    using W = gs::Sharded<D, M, "K:y">;
    using C = gs::Sharded<std::int64_t, M, "S:y">;
    using R = gs::Sharded<D, M, "V M">;
    const C ids = make_indices<C>(mesh, {5}, 4, 5);
    const R r = make<R>(mesh, {4, 3}, 11);
    auto f = [&](const X& x, const W& w) {
      auto s = gs::scatter_add<"V">(gs::einsum<"MSK,K->MS">(x, w), ids, 4);
      return gs::einsum<"VM,VM->">(gs::sigmoid(s), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 5, 3}, 12), make<W>(mesh, {3}, 13)) < 1e-6);
  }
  // 6. A round trip: scatter_add of looked-up rows (the table's gradient flows through both).
  {
    using T = gs::Sharded<D, M, "V:y M">;
    using C = gs::Sharded<std::int32_t, M, "B:x">;
    using R = gs::Sharded<D, M, "U M">;
    const C ids = make_indices<C>(mesh, {5}, 6, 6);
    const C dest = make_indices<C>(mesh, {5}, 3, 7);
    const R r = make<R>(mesh, {3, 3}, 14);
    auto f = [&](const T& t) {
      auto rows = gs::take<"V">(t, ids);
      return gs::einsum<"UM,UM->">(gs::scatter_add<"U">(rows * rows, dest, 3), r).eval();
    };
    CHECK(fd_relative_error(f, make<T>(mesh, {6, 3}, 15)) < 1e-6);
  }
  // 7. Several axes on the vocabulary label (3-axis meshes): each rank owns a V shard.
  if constexpr (M::axis_count == 3) {
    using T = gs::Sharded<D, M, "V:y*z M:x">;
    using C = gs::Sharded<std::int32_t, M, "B">;
    using R = gs::Sharded<D, M, "B M">;
    const C ids = make_indices<C>(mesh, {6}, 7, 8);
    const R r = make<R>(mesh, {6, 3}, 16);
    auto f = [&](const T& t) { return gs::einsum<"BM,BM->">(gs::take<"V">(t, ids), r).eval(); };
    CHECK(fd_relative_error(f, make<T>(mesh, {7, 3}, 17)) < 1e-6);
  }
}

template <class M>
void random_cases(const M& mesh) {
  using D = double;
  using X = gs::Sharded<D, M, "A:x B:y">;
  const X r = make<X>(mesh, {5, 7}, 20);
  // 1. dropout at several rates (0 keeps everything), after a nonlinearity.
  for (const double rate : {0.0, 0.3, 0.75}) {
    auto f = [&](const X& x) {
      return gs::einsum<"AB,AB->">(gs::dropout(x * x, 11, rate), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 21)) < 1e-6);
  }
  // 2. dropout of a pending partial sum (K contracted over y), then a nonlinearity.
  {
    using P = gs::Sharded<D, M, "A:x K:y">;
    using W = gs::Sharded<D, M, "K:y B">;
    auto f = [&](const P& p, const W& w) {
      return gs::einsum<"AB,AB->">(gs::tanh(gs::dropout(gs::einsum<"AK,KB->AB">(p, w), 12, 0.4)), r)
          .eval();
    };
    CHECK(fd_relative_error(f, make<P>(mesh, {5, 3}, 22), make<W>(mesh, {3, 7}, 23)) < 1e-6);
  }
  // 3. uniform_noise (additive), on a plain and on a pending partial input.
  {
    auto f = [&](const X& x) {
      return gs::einsum<"AB,AB->">(gs::uniform_noise(x * x, 13, -0.5, 0.5), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 24)) < 1e-6);
    using P = gs::Sharded<D, M, "A:x K:y">;
    using W = gs::Sharded<D, M, "K:y B">;
    auto g = [&](const P& p, const W& w) {
      auto y = gs::uniform_noise(gs::einsum<"AK,KB->AB">(p, w), 14, 0.0, 2.0);
      return gs::einsum<"AB,AB->">(gs::sigmoid(y), r).eval();
    };
    CHECK(fd_relative_error(g, make<P>(mesh, {5, 3}, 25), make<W>(mesh, {3, 7}, 26)) < 1e-6);
  }
  // 4. random_*_like: constants w.r.t. x (no node); x's gradient comes from its other use only.
  {
    auto f = [&](const X& x) {
      const X u = gs::random_uniform_like(x, 15, -1.0, 1.0);
      const X n = gs::random_normal_like(x, 16, 0.5, 2.0);
      CHECK(!u.grad_node());
      CHECK(!n.grad_node());
      return gs::einsum<"AB,AB->">(x * u + n * x * x, r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 27)) < 1e-6);
  }
}

TEST_CASE("take, embedding and scatter_add gradients equal finite differences on every mesh") {
  on_every_mesh([](const auto& mesh) { index_cases(mesh); });
}

TEST_CASE("dropout, uniform_noise and random_*_like gradients equal finite differences") {
  on_every_mesh([](const auto& mesh) { random_cases(mesh); });
}

// The backward kernels alone: take's table gradient is computed in each rank's vocabulary shard
// (the table's local size, never the whole table) and scatter_add's values gradient is a local
// lookup; neither communicates. Checked against naive loops over the global arrays.
TEST_CASE("the index backward kernels stay in the shards and do not communicate") {
  using M = gs::Mesh<"x", "y">;
  using D = double;
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;  // the 2x2x2 mesh is in the finite-difference cases
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh = mesh_of<M>(s);
    using I = std::int32_t;
    {
      using T = gs::Sharded<D, M, "V:y M:x">;
      using C = gs::Sharded<I, M, "B S">;
      using G = gs::Sharded<D, M, "B S M:x">;
      const C ids = make_indices<C>(mesh, {3, 4}, 7, 1);
      const G g = make<G>(mesh, {3, 4, 5}, 2);
      gs::comm_counters().reset();
      const auto r = gs::detail::take_cotangent<D, I>(
          'V', 7, T::layout.dims[0], gs::detail::runtime_tensor(ids), gs::detail::runtime_tensor(g),
          gshard::detail::mesh_state(mesh));
      CHECK(gs::comm_counters().total().calls == 0);
      CHECK(r.layout == T::layout);
      REQUIRE(static_cast<std::int64_t>(r.data.extent(0)) == T(mesh, {7, 5}).local_size());
      const std::vector<D> got = T(mesh, {7, 5}, r.data).to_global();
      const std::vector<I> iv = ids.to_global();
      const std::vector<D> gv = g.to_global();
      std::vector<D> want(35, 0.0);
      for (std::size_t bs = 0; bs < iv.size(); ++bs)
        for (std::size_t m = 0; m < 5; ++m)
          want[static_cast<std::size_t>(iv[bs]) * 5 + m] += gv[bs * 5 + m];
      double err = 0;
      for (std::size_t e = 0; e < want.size(); ++e) err = std::max(err, std::abs(got[e] - want[e]));
      CHECK(err < 1e-12);
    }
    {
      using G = gs::Sharded<D, M, "V M:y">;
      using C = gs::Sharded<I, M, "B:x S">;
      using X = gs::Sharded<D, M, "B:x S M:y">;
      const C ids = make_indices<C>(mesh, {3, 2}, 6, 3);
      const G g = make<G>(mesh, {6, 5}, 4);
      gs::comm_counters().reset();
      const auto r = gs::detail::scatter_add_cotangent<D, I>(
          'V', gs::detail::runtime_tensor(ids), gs::detail::runtime_tensor(g),
          gshard::detail::mesh_state(mesh), gs::detail::axis_name_list<M>());
      CHECK(gs::comm_counters().total().calls == 0);
      CHECK(r.layout == X::layout);
      REQUIRE(static_cast<std::int64_t>(r.data.extent(0)) == X(mesh, {3, 2, 5}).local_size());
      const std::vector<D> got = X(mesh, {3, 2, 5}, r.data).to_global();
      const std::vector<I> iv = ids.to_global();
      const std::vector<D> gv = g.to_global();
      bool same = true;
      for (std::size_t bs = 0; bs < iv.size(); ++bs)
        for (std::size_t m = 0; m < 5; ++m)
          same = same && got[bs * 5 + m] == gv[static_cast<std::size_t>(iv[bs]) * 5 + m];
      CHECK(same);
    }
  }
}

}  // namespace
