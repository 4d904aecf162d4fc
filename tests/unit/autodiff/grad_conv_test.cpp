// Gradients of the windowed ops (ops/conv.hpp): conv1d, conv2d and conv (3 spatial labels) with
// respect to input and weights, every padding, stride and dilation, spatial labels split over
// one or two mesh axes (halos wider than a shard), split and partial input channels, a partial
// input; max_pool and avg_pool. Central finite differences in double on every listed mesh shape
// with uneven sizes; max pooling's tie rule and the halo bytes of the backward pass are checked
// exactly against a naive loop.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/ops/conv.hpp>
#include <gshard/ops/reduce.hpp>
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
using gs::Shape;
using gshard::test::fd_relative_error;
using gshard::test::listed_mesh_shapes;
using gshard::test::make;
using gshard::test::mesh_of;
using gshard::test::on_every_mesh;
using gshard::test::world_size;

// Convolutions on one mesh whose axes are x and y (and z); loss = <conv(x, w), r>.
template <class M>
void conv_cases(const M& mesh) {
  using D = double;
  // 1. conv1d, valid: batch over x, the spatial label over y.
  {
    using X = gs::Sharded<D, M, "B:x L:y C">;
    using W = gs::Sharded<D, M, "O C K">;
    using R = gs::Sharded<D, M, "B L O">;
    const R r = make<R>(mesh, {3, 7, 2}, 1);
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"BLO,BLO->">(gs::conv1d<"L:K C->O">(x, w), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 9, 2}, 2), make<W>(mesh, {2, 2, 3}, 3)) < 1e-6);
  }
  // 2. conv1d, stride 2 and dilation 2, the spatial label over x*y (halos from several hops).
  {
    using X = gs::Sharded<D, M, "L:x*y C B">;
    using W = gs::Sharded<D, M, "K O C">;
    using R = gs::Sharded<D, M, "L O B">;
    const R r = make<R>(mesh, {5, 2, 2}, 4);
    const gs::ConvOptions opt{.stride = {2, 1, 1}, .dilation = {2, 1, 1}};
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"LOB,LOB->">(gs::conv1d<"L:K C->O">(x, w, opt), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {13, 2, 2}, 5), make<W>(mesh, {3, 2, 2}, 6)) < 1e-6);
  }
  // 3. conv1d, padding same with an even kernel; C split over x (a partial result).
  {
    using X = gs::Sharded<D, M, "B L:y C:x">;
    using W = gs::Sharded<D, M, "O C K">;
    using R = gs::Sharded<D, M, "B L O">;
    const R r = make<R>(mesh, {2, 7, 2}, 7);
    const gs::ConvOptions opt{.padding = gs::Padding::same};
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"BLO,BLO->">(gs::conv1d<"L:K C->O">(x, w, opt), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {2, 7, 3}, 8), make<W>(mesh, {2, 3, 4}, 9)) < 1e-6);
  }
  // 4. same padding with dilation; O split over y (the input's cotangent is partial over y), the
  //    weights' C over x while the input uses x for the batch (the weights are gathered).
  {
    using X = gs::Sharded<D, M, "B:x L C">;
    using W = gs::Sharded<D, M, "O:y C:x K">;
    using R = gs::Sharded<D, M, "B L O">;
    const R r = make<R>(mesh, {3, 6, 3}, 10);
    const gs::ConvOptions opt{.padding = gs::Padding::same, .dilation = {2, 1, 1}};
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"BLO,BLO->">(gs::conv<"L:K C->O">(x, w, opt), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 6, 2}, 11), make<W>(mesh, {3, 2, 2}, 12)) < 1e-6);
  }
  // 5. conv2d, same padding, dilation along H: H over x, W over y (corners in two steps).
  {
    using X = gs::Sharded<D, M, "B H:x W:y C">;
    using Wt = gs::Sharded<D, M, "O C K L">;
    using R = gs::Sharded<D, M, "B H W O">;
    const R r = make<R>(mesh, {1, 5, 4, 2}, 13);
    const gs::ConvOptions opt{.padding = gs::Padding::same, .dilation = {2, 1, 1}};
    auto f = [&](const X& x, const Wt& w) {
      return gs::einsum<"BHWO,BHWO->">(gs::conv2d<"H:K W:L C->O">(x, w, opt), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {1, 5, 4, 2}, 14), make<Wt>(mesh, {2, 2, 3, 2}, 15)) <
          1e-6);
  }
  // 6. conv2d, valid, stride 2 along H: H over y, W over x, batch last.
  {
    using X = gs::Sharded<D, M, "H:y W:x C B">;
    using Wt = gs::Sharded<D, M, "K L C O">;
    using R = gs::Sharded<D, M, "H W O B">;
    const R r = make<R>(mesh, {3, 3, 2, 2}, 16);
    const gs::ConvOptions opt{.stride = {2, 1, 1}};
    auto f = [&](const X& x, const Wt& w) {
      return gs::einsum<"HWOB,HWOB->">(gs::conv2d<"H:K W:L C->O">(x, w, opt), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {7, 4, 1, 2}, 17), make<Wt>(mesh, {3, 2, 1, 2}, 18)) <
          1e-6);
  }
  // 7. Three spatial labels, strides 1, 2, 1.
  {
    using X = gs::Sharded<D, M, "D:x H:y W C">;
    using Wt = gs::Sharded<D, M, "O C P K L">;
    using R = gs::Sharded<D, M, "D H W O">;
    const R r = make<R>(mesh, {3, 2, 2, 2}, 19);
    const gs::ConvOptions opt{.stride = {1, 2, 1}};
    auto f = [&](const X& x, const Wt& w) {
      return gs::einsum<"DHWO,DHWO->">(gs::conv<"D:P H:K W:L C->O">(x, w, opt), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {4, 4, 3, 1}, 20),
                            make<Wt>(mesh, {2, 1, 2, 2, 2}, 21)) < 1e-6);
  }
  // 8. A partial input (a sum over E split over y): its pending sum stays pending through conv.
  {
    using X = gs::Sharded<D, M, "B L:x C E:y">;
    using W = gs::Sharded<D, M, "O C K">;
    using R = gs::Sharded<D, M, "B L O">;
    const R r = make<R>(mesh, {2, 5, 2}, 22);
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"BLO,BLO->">(gs::conv1d<"L:K C->O">(gs::sum<"E">(x), w), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {2, 7, 2, 3}, 23), make<W>(mesh, {2, 2, 3}, 24)) <
          1e-6);
  }
  if constexpr (M::axis_count == 3) {
    // 9. Every axis busy: batch over z, H over x*y; the weights' O over z is refused (z splits
    //    the batch), so the result is replicated along O.
    using X = gs::Sharded<D, M, "B:z H:x*y C">;
    using W = gs::Sharded<D, M, "O:z C K">;
    using R = gs::Sharded<D, M, "B H O">;
    const R r = make<R>(mesh, {3, 9, 2}, 25);
    const gs::ConvOptions opt{.padding = gs::Padding::same};
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"BHO,BHO->">(gs::conv1d<"H:K C->O">(x, w, opt), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 9, 2}, 26), make<W>(mesh, {2, 2, 3}, 27)) < 1e-6);
  }
}

// Pooling on one mesh; loss = <pool(x), r>.
template <class M>
void pool_cases(const M& mesh) {
  using D = double;
  // 1. max_pool 2-d, window 2x3, stride 1x2: H over x, W over y (overlapping windows along H).
  {
    using X = gs::Sharded<D, M, "B H:x W:y">;
    const X r = make<X>(mesh, {1, 4, 2}, 31);
    auto f = [&](const X& x) {
      return gs::einsum<"BHW,BHW->">(
                 gs::max_pool<"HW">(x, {.window = {2, 3, 1}, .stride = {1, 2, 1}}), r)
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {1, 5, 6}, 32)) < 1e-6);
  }
  // 2. max_pool 1-d, default stride, of a partial input (finished first): L over x, the summed
  //    C over y.
  {
    using X = gs::Sharded<D, M, "L:x B C:y">;
    using Y = gs::Sharded<D, M, "L B">;
    const Y r = make<Y>(mesh, {3, 2}, 33);
    auto f = [&](const X& x) {
      return gs::einsum<"LB,LB->">(gs::max_pool<"L">(gs::sum<"C">(x), {.window = {3, 1, 1}}), r)
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {11, 2, 2}, 34)) < 1e-6);
  }
  // 2b. max_pool 1-d over x*y, window 2, stride 3 (rows no window reads get nothing).
  {
    using X = gs::Sharded<D, M, "L:x*y B">;
    const X r = make<X>(mesh, {4, 2}, 39);
    auto f = [&](const X& x) {
      return gs::einsum<"LB,LB->">(gs::max_pool<"L">(x, {.window = {2, 1, 1}, .stride = {3, 1, 1}}),
                                   r)
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {11, 2}, 40)) < 1e-6);
  }
  // 3. avg_pool 2-d of a partial input, window 3x2, stride 2x(window): the sum stays pending.
  {
    using X = gs::Sharded<D, M, "H:x W C:y">;
    using Y = gs::Sharded<D, M, "H W">;
    const Y r = make<Y>(mesh, {3, 2}, 35);
    auto f = [&](const X& x) {
      return gs::einsum<"HW,HW->">(
                 gs::avg_pool<"HW">(gs::sum<"C">(x), {.window = {3, 2, 1}, .stride = {2, 0, 0}}), r)
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {7, 4, 2}, 36)) < 1e-6);
  }
  // 4. avg_pool 1-d, window 2, stride 1, the label over x*y.
  {
    using X = gs::Sharded<D, M, "L:x*y B">;
    const X r = make<X>(mesh, {9, 2}, 37);
    auto f = [&](const X& x) {
      return gs::einsum<"LB,LB->">(gs::avg_pool<"L">(x, {.window = {2, 1, 1}, .stride = {1, 1, 1}}),
                                   r)
          .eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {10, 2}, 38)) < 1e-6);
  }
}

TEST_CASE("conv gradients equal central finite differences (double) on every mesh shape") {
  on_every_mesh([](const auto& mesh) { conv_cases(mesh); });
}

TEST_CASE("pooling gradients equal central finite differences (double) on every mesh shape") {
  on_every_mesh([](const auto& mesh) { pool_cases(mesh); });
}

TEST_CASE("max_pool sends the cotangent to the first maximum of each window on ties") {
  using M = gs::Mesh<"x", "y">;
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh = mesh_of<M>(s);
    using X = gs::Sharded<double, M, "H:x W:y">;
    const std::int64_t H = 7, W = 6, wh = 3, ww = 2, sh = 2, sw = 1;
    const std::int64_t oh = (H - wh) / sh + 1, ow = (W - ww) / sw + 1;
    std::vector<double> xv(static_cast<std::size_t>(H * W));
    for (std::size_t i = 0; i < xv.size(); ++i) xv[i] = static_cast<double>((i * 7) % 3);
    X x = gs::from_global<X>(mesh, {H, W}, xv);
    const X r = make<X>(mesh, {oh, ow}, 41);
    gs::track(x);
    const auto loss =
        gs::einsum<"HW,HW->">(gs::max_pool<"HW">(x, {.window = {3, 2, 1}, .stride = {2, 1, 1}}), r)
            .eval();
    const auto [g] = gs::grad(loss, x);
    const auto gv = g.to_global(), rv = r.to_global();
    std::vector<double> want(xv.size(), 0.0);
    for (std::int64_t i = 0; i < oh; ++i)
      for (std::int64_t j = 0; j < ow; ++j) {
        std::int64_t best = -1;
        for (std::int64_t a = 0; a < wh; ++a)
          for (std::int64_t b = 0; b < ww; ++b) {
            const std::int64_t at = (i * sh + a) * W + j * sw + b;
            if (best < 0 || xv[static_cast<std::size_t>(at)] > xv[static_cast<std::size_t>(best)])
              best = at;
          }
        want[static_cast<std::size_t>(best)] += rv[static_cast<std::size_t>(i * ow + j)];
      }
    double err = 0;
    for (std::size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(gv[i] - want[i]));
    CHECK(err < 1e-12);
  }
}

TEST_CASE("the input cotangent returns exactly the forward's halo bytes, and nothing else moves") {
  using M = gs::Mesh<"x", "y">;
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh = mesh_of<M>(s);
    using X = gs::Sharded<double, M, "B L:x*y C">;
    using W = gs::Sharded<double, M, "O C K">;
    using R = gs::Sharded<double, M, "B L O">;
    X x = make<X>(mesh, {2, 19, 3}, 51);
    const W w = make<W>(mesh, {2, 3, 5}, 52);
    const R r = make<R>(mesh, {2, 19, 2}, 53);
    gs::track(x);
    gs::comm_counters().reset();
    const auto y = gs::conv1d<"L:K C->O">(x, w, {.padding = gs::Padding::same});
    const gs::CommCount fwd = gs::comm_counters().total();
    const auto loss = gs::einsum<"BLO,BLO->">(y, r).eval();
    gs::comm_counters().reset();
    const auto [g] = gs::grad(loss, x);
    const gs::CommCount bwd = gs::comm_counters().total();
    const gs::CommCount perm = gs::comm_counters().get("x*y", gs::Collective::permute);
    CHECK(bwd.calls == fwd.calls);
    CHECK(perm.calls == bwd.calls);
    // Each rank returns what it received: equal in total over the world.
    std::int64_t bytes[2] = {fwd.bytes, bwd.bytes};
    MPI_Allreduce(MPI_IN_PLACE, bytes, 2, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    CHECK(bytes[0] == bytes[1]);
    // The halo rows each block receives (pad 2 either side), B*C values each.
    const std::int64_t k = s[0] * s[1], chunk = (19 + k - 1) / k;
    std::int64_t rows = 0;
    for (std::int64_t i = 0; i < k; ++i) {
      const std::int64_t o0 = chunk * i, o1 = std::min<std::int64_t>(19, o0 + chunk);
      if (o1 <= o0) continue;
      const std::int64_t lo = std::max<std::int64_t>(0, o0 - 2);
      const std::int64_t hi = std::min<std::int64_t>(19, o1 + 2);
      rows += (hi - lo) - (o1 - o0);
    }
    CHECK(bytes[1] == rows * 2 * 3 * 8);
    // And the values: dx[b,l,c] = sum_{o,k} r[b, l - k + 2, o] w[o, c, k].
    const auto gv = g.to_global(), wv = w.to_global(), rv = r.to_global();
    double err = 0;
    for (int b = 0; b < 2; ++b)
      for (int l = 0; l < 19; ++l)
        for (int c = 0; c < 3; ++c) {
          double e = 0;
          for (int o = 0; o < 2; ++o)
            for (int kk = 0; kk < 5; ++kk) {
              const int p = l - kk + 2;
              if (p >= 0 && p < 19)
                e += rv[static_cast<std::size_t>((b * 19 + p) * 2 + o)] *
                     wv[static_cast<std::size_t>((o * 3 + c) * 5 + kk)];
            }
          err = std::max(err, std::abs(e - gv[static_cast<std::size_t>((b * 19 + l) * 3 + c)]));
        }
    CHECK(err < 1e-12);
  }
}

}  // namespace
