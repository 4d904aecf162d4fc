// Reverse-mode autodiff (autodiff/grad.hpp) through einsum, fused elementwise trees, reshards
// and relabels: gradients against central finite differences in double on every listed mesh
// shape with uneven sizes, the data-parallel reduction happening exactly once, the same
// gradients on every mesh, graph reuse and tracking errors, and small trainings.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/nn/optimizers.hpp>
#include <gshard/nn/schedules.hpp>
#include <gshard/ops/normalize.hpp>
#include <gshard/ops/reduce.hpp>
// clang-format on

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
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
using gshard::test::smooth_values;
using gshard::test::world_size;

// The cases, on one mesh whose axes are x and y (and z).
template <class M>
void gradient_cases(const M& mesh) {
  using D = double;
  // 1. Einsum contracting a split label (K over y: a partial sum), data split over x.
  {
    using X = gs::Sharded<D, M, "B:x K:y">;
    using W = gs::Sharded<D, M, "K:y H">;
    using R = gs::Sharded<D, M, "B:x H">;
    const R r = make<R>(mesh, {5, 3}, 9);
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"BH,BH->">(gs::tanh(gs::einsum<"BK,KH->BH">(x, w)), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 1), make<W>(mesh, {7, 3}, 2)) < 1e-6);
  }
  // 2. A label summed away in one operand only (A), and a broadcast operand.
  {
    using X = gs::Sharded<D, M, "A:y B C:x">;
    using W = gs::Sharded<D, M, "C D">;
    using R = gs::Sharded<D, M, "B D:y">;
    const R r = make<R>(mesh, {3, 5}, 8);
    auto f = [&](const X& x, const W& w) {
      return gs::einsum<"BD,BD->">(gs::einsum<"ABC,CD->BD">(x, w), r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {3, 3, 5}, 3), make<W>(mesh, {5, 5}, 4)) < 1e-6);
  }
  // 3. Unary einsums: a transpose with a sum, then a broadcast product.
  {
    using X = gs::Sharded<D, M, "A:x B:y C">;
    using R = gs::Sharded<D, M, "C A">;
    const R r = make<R>(mesh, {3, 5}, 7);
    auto f = [&](const X& x) {
      auto t = gs::einsum<"ABC->CA">(x);
      return gs::einsum<"CA,CA->">(t * t, r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 3, 3}, 5)) < 1e-6);
  }
  // 4. Every unary op in one fused tree, with scalars on both sides.
  {
    using X = gs::Sharded<D, M, "A:x B:y">;
    const X r = make<X>(mesh, {5, 7}, 11);
    auto f = [&](const X& x) {
      auto a = gs::abs(x);
      X y = gs::exp(-gs::square(x)) + gs::log(a + 2.0) * gs::sqrt(a + 1.0) +
            gs::rsqrt(x * x + 1.0) + gs::tanh(x) * gs::sigmoid(x) + gs::gelu(x) +
            gs::relu(x) * 3.0 - (2.0 - x) / 4.0;
      return gs::einsum<"AB,AB->">(y, r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 6)) < 1e-6);
  }
  // 5. Binary ops, broadcasting by label (v along A), where, pow, minimum, maximum, division.
  {
    using X = gs::Sharded<D, M, "A:x B">;
    using V = gs::Sharded<D, M, "B">;
    using C = gs::Sharded<std::int32_t, M, "A B">;
    Shape::value_type n = 5 * 4;
    std::vector<std::int32_t> cv(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < cv.size(); ++i) cv[i] = static_cast<std::int32_t>(i % 3 == 0);
    const C c = gs::from_global<C>(mesh, {5, 4}, cv);
    const X r = make<X>(mesh, {5, 4}, 12);
    auto f = [&](const X& x, const V& v) {
      X y = gs::pow(gs::abs(x) + 1.0, v * 0.5) + gs::minimum(x, v) * gs::maximum(x, v * 2.0) +
            gs::where(c, x * v, x / (v * v + 1.0)) - v;
      return gs::einsum<"AB,AB->">(y, r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 4}, 13), make<V>(mesh, {4}, 14)) < 1e-6);
  }
  // 6. Reshards and relabels on the way: gradients come back through the reverse collectives.
  {
    using X = gs::Sharded<D, M, "A:x B:y">;
    using XT = gs::Sharded<D, M, "B:x A">;
    using W = gs::Sharded<D, M, "P Q:y">;
    auto f = [&](const X& x, const W& w) {
      const XT t = gs::reshard<XT>(x);
      auto p = t.template as<"PQ">();  // "P:x Q"
      return gs::einsum<"PQ,PQ->">(gs::sigmoid(p) * w, p).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 6}, 15), make<W>(mesh, {6, 5}, 16)) < 1e-6);
  }
  // 8. Reductions over split labels: sum, mean, max, min, logsumexp, norm.
  {
    using X = gs::Sharded<D, M, "A:x B:y">;
    using RA = gs::Sharded<D, M, "A">;
    using RB = gs::Sharded<D, M, "B">;
    const RA ra = make<RA>(mesh, {5}, 22);
    const RB rb = make<RB>(mesh, {7}, 23);
    auto f = [&](const X& x) {
      RA a = gs::sum<"B">(x) + gs::logsumexp<"B">(x) + gs::max<"B">(x) + gs::norm<"B">(x);
      RB b = gs::mean<"A">(x) + gs::min<"A">(x);
      return (gs::einsum<"A,A->">(a, ra) + gs::einsum<"B,B->">(b, rb)).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {5, 7}, 24)) < 1e-6);
  }
  // 9. softmax and log_softmax over a split label.
  {
    using X = gs::Sharded<D, M, "A:x B:y">;
    const X r = make<X>(mesh, {4, 7}, 25);
    auto f = [&](const X& x) {
      X y = gs::softmax<"B">(x) * 3.0 + gs::log_softmax<"B">(x * 0.5);
      return gs::einsum<"AB,AB->">(y, r).eval();
    };
    CHECK(fd_relative_error(f, make<X>(mesh, {4, 7}, 26)) < 1e-6);
  }
  // 7. A two-layer MLP, Megatron style (H over y), data over x, with a bias.
  {
    using X = gs::Sharded<D, M, "B:x I">;
    using W1 = gs::Sharded<D, M, "I H:y">;
    using B1 = gs::Sharded<D, M, "H:y">;
    using W2 = gs::Sharded<D, M, "H:y O">;
    using R = gs::Sharded<D, M, "B:x O">;
    const X x = make<X>(mesh, {6, 3}, 17);
    const R r = make<R>(mesh, {6, 2}, 18);
    auto f = [&](const W1& w1, const B1& b1, const W2& w2) {
      auto h = gs::gelu(gs::einsum<"BI,IH->BH">(x, w1) + b1);
      return gs::einsum<"BO,BO->">(gs::einsum<"BH,HO->BO">(h, w2), r).eval();
    };
    CHECK(fd_relative_error(f, make<W1>(mesh, {3, 5}, 19), make<B1>(mesh, {5}, 20),
                            make<W2>(mesh, {5, 2}, 21)) < 1e-6);
  }
}

TEST_CASE("gradients equal central finite differences (double) on every mesh shape") {
  on_every_mesh([](const auto& mesh) { gradient_cases(mesh); });
}

TEST_CASE("data parallelism: a replicated weight's gradient is reduced once, at the end") {
  using M = gs::Mesh<"x", "y">;
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;  // the 2x2x2 mesh is in the finite-difference cases
    const M mesh = mesh_of<M>(s);
    INFO("mesh " << gshard::test::sizes_text(s));
    using X = gs::Sharded<double, M, "B:x I">;
    using W = gs::Sharded<double, M, "I H">;
    using R = gs::Sharded<double, M, "B:x H">;
    const X x = make<X>(mesh, {7, 4}, 1);
    const R r = make<R>(mesh, {7, 3}, 2);
    W w = make<W>(mesh, {4, 3}, 3);
    gs::track(w);
    const auto loss = gs::einsum<"BH,BH->">(gs::tanh(gs::einsum<"BI,IH->BH">(x, w)), r).eval();
    gs::comm_counters().reset();
    const auto [g] = gs::grad(loss, w);
    const auto ar = gs::comm_counters().get("x", gs::Collective::all_reduce);
    CHECK(ar.calls == (s[0] > 1 ? 1 : 0));
    CHECK(ar.bytes == (s[0] > 1 ? 2 * (s[0] - 1) * 12 * 8 / s[0] : 0));
    CHECK(gs::comm_counters().total().calls == ar.calls);
    // Against the naive gradient: dW = X^T (r * (1 - tanh^2(XW))).
    const auto xv = x.to_global(), wv = w.to_global(), rv = r.to_global(), gv = g.to_global();
    double err = 0;
    for (int i = 0; i < 4; ++i)
      for (int h = 0; h < 3; ++h) {
        double e = 0;
        for (int b = 0; b < 7; ++b) {
          double z = 0;
          for (int k = 0; k < 4; ++k) z += xv[b * 4 + k] * wv[k * 3 + h];
          e += xv[b * 4 + i] * rv[b * 3 + h] * (1 - std::tanh(z) * std::tanh(z));
        }
        err = std::max(err, std::abs(e - gv[i * 3 + h]));
      }
    CHECK(err < 1e-12);
  }
}

// The float MLP's gradients on one mesh, as global vectors.
template <class M>
std::vector<std::vector<float>> float_mlp_gradients(const M& mesh) {
  using X = gs::Sharded<float, M, "B:x I">;
  using W1 = gs::Sharded<float, M, "I H:y">;
  using W2 = gs::Sharded<float, M, "H O">;
  using R = gs::Sharded<float, M, "B O">;
  const X x = gs::random_normal<X>(mesh, {9, 6}, 1);
  W1 w1 = gs::random_normal<W1>(mesh, {6, 10}, 2);
  W2 w2 = gs::random_normal<W2>(mesh, {10, 3}, 3);
  const R r = gs::random_normal<R>(mesh, {9, 3}, 4);
  gs::track(std::tie(w1, w2));
  auto h = gs::relu(gs::einsum<"BI,IH->BH">(x, w1));
  const auto loss = gs::einsum<"BO,BO->">(gs::einsum<"BH,HO->BO">(h, w2), r).eval();
  const auto [g1, g2] = gs::grad(loss, std::tie(w1, w2));
  return {g1.to_global(), g2.to_global()};
}

TEST_CASE("the same global inputs give the same gradients on every mesh (float)") {
  using M = gs::Mesh<"x", "y">;
  const M single(MPI_COMM_SELF, {1, 1});
  const auto ref = float_mlp_gradients(single);
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const auto got = float_mlp_gradients(mesh_of<M>(s));
    for (std::size_t t = 0; t < ref.size(); ++t) {
      double diff = 0, norm = 0;
      for (std::size_t i = 0; i < ref[t].size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::abs(got[t][i] - ref[t][i])));
        norm = std::max(norm, static_cast<double>(std::abs(ref[t][i])));
      }
      CHECK(diff <= 1e-5 * std::max(1.0, norm));
    }
  }
}

TEST_CASE("cast passes gradients through, converted to each side's element type") {
  using M = gs::Mesh<"x", "y">;
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh = mesh_of<M>(s);
    using F = gs::Sharded<float, M, "A:x B:y">;
    using D = gs::Sharded<double, M, "A:x B:y">;
    F xf = gs::random_normal<F>(mesh, {5, 3}, 1);
    D xd = gs::random_normal<D>(mesh, {5, 3}, 2);
    const D r = gs::random_normal<D>(mesh, {5, 3}, 3);
    const F rf = gs::random_normal<F>(mesh, {5, 3}, 4);
    gs::track(std::tie(xf, xd));
    // d/dxf sum(cast<double>(xf)^2 r) = 2 xf r; d/dxd sum(cast<float>(xd) rf) = rf.
    const auto a = gs::cast<double>(xf);
    const auto loss = (gs::einsum<"AB,AB->">(a * a, r) +
                       gs::cast<double>(gs::einsum<"AB,AB->">(gs::cast<float>(xd), rf)))
                          .eval();
    const auto [gf, gd] = gs::grad(loss, std::tie(xf, xd));
    const std::vector<float> xv = xf.to_global(), gfv = gf.to_global(), rfv = rf.to_global();
    const std::vector<double> gdv = gd.to_global(), rv = r.to_global();
    double err = 0;
    for (std::size_t i = 0; i < xv.size(); ++i) {
      err = std::max(
          err, std::abs(static_cast<double>(gfv[i]) - 2.0 * static_cast<double>(xv[i]) * rv[i]));
      err = std::max(err, std::abs(gdv[i] - static_cast<double>(rfv[i])));
    }
    CHECK(err < 1e-5);
  }
}

TEST_CASE("graph use: once per forward, tracked parameters only, on every rank alike") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  using X = gs::Sharded<double, M, "A:x B">;
  X x = make<X>(mesh, {5, 3}, 1);
  X plain = make<X>(mesh, {5, 3}, 2);
  gs::track(x);
  auto loss = gs::einsum<"AB,AB->">(gs::exp(x), plain).eval();
  const auto [g] = gs::grad(loss, x);
  (void)g;
  std::string why;
  try {
    (void)gs::grad(loss, x);
  } catch (const gs::Error& e) {
    why = e.what();
  }
  CHECK(why.find("already used by an earlier grad()") != std::string::npos);
  why.clear();
  // Argument errors name the caller's line (grad's defaulted source_location).
  const auto exp_x = gs::einsum<"AB,AB->">(gs::exp(x), plain).eval();
  int line = __LINE__ + 2;
  try {
    (void)gs::grad(exp_x, std::tie(x, plain));
  } catch (const gs::Error& e) {
    why = e.what();
  }
  CHECK(why.find("parameter 1") != std::string::npos);
  CHECK(why.find("is not tracked") != std::string::npos);
  CHECK(why.ends_with("(at grad_test.cpp:" + std::to_string(line) + ")"));
  why.clear();
  try {
    gs::NoGrad off;
    const auto untracked = gs::einsum<"AB,AB->">(gs::exp(x), plain).eval();
    line = __LINE__ + 1;
    (void)gs::grad(untracked, x);
  } catch (const gs::Error& e) {
    why = e.what();
  }
  CHECK(why.find("does not depend on any tracked tensor") != std::string::npos);
  CHECK(why.ends_with("(at grad_test.cpp:" + std::to_string(line) + ")"));
  // A parameter the loss does not use gets a zero gradient.
  X unused = make<X>(mesh, {5, 3}, 3);
  gs::track(unused);
  const auto [gx, gu] = gs::grad(gs::einsum<"AB,AB->">(x * x, plain).eval(), std::tie(x, unused));
  for (double v : gu.to_global()) CHECK(v == 0.0);
  const auto xv = x.to_global(), pv = plain.to_global(), gv = gx.to_global();
  for (std::size_t i = 0; i < xv.size(); ++i) CHECK(std::abs(gv[i] - 2 * xv[i] * pv[i]) < 1e-12);
}

TEST_CASE("least squares trains to the known solution with SGD") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  using A = gs::Sharded<double, M, "N:x D">;
  using V = gs::Sharded<double, M, "D">;
  using Y = gs::Sharded<double, M, "N:x">;
  const Shape::value_type rows = 23, dims = 4;
  const A a = gs::random_normal<A>(mesh, {rows, dims}, 5);
  const std::vector<double> truth{0.5, -1.25, 2.0, 0.75};
  const V w_true = gs::from_global<V>(mesh, {dims}, truth);
  const Y y = gs::einsum<"ND,D->N">(a, w_true);
  V w(mesh, {dims});
  gs::track(w);
  gs::nn::Sgd opt({.learning_rate = 0.05, .momentum = 0.9});
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    auto res = gs::einsum<"ND,D->N">(a, w) - y;
    const auto loss = (gs::einsum<"N,N->">(res, res) * (1.0 / rows)).eval();
    auto [g] = gs::grad(loss, w);
    const double l = loss.to_global()[0];
    if (step == 0) first = l;
    last = l;
    opt.step(std::tie(w), std::tie(g));
  }
  CHECK(last < 1e-12 * first);
  const auto got = w.to_global();
  for (std::size_t i = 0; i < truth.size(); ++i) CHECK(std::abs(got[i] - truth[i]) < 1e-6);
}

TEST_CASE("a 2-layer MLP trains to a teacher's function with Adam") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n >= 2 ? 2 : 1, n >= 2 ? n / 2 : 1});
  using X = gs::Sharded<double, M, "B:x I">;
  using W1 = gs::Sharded<double, M, "I H:y">;
  using W2 = gs::Sharded<double, M, "H:y O">;
  using Y = gs::Sharded<double, M, "B:x O">;
  const X x = gs::random_normal<X>(mesh, {64, 3}, 1);
  // The teacher has the student's architecture, so zero loss is reachable.
  const W1 t1 = gs::random_normal<W1>(mesh, {3, 8}, 2);
  const W2 t2 = gs::random_normal<W2>(mesh, {8, 2}, 3);
  const Y y = gs::einsum<"BH,HO->BO">(gs::tanh(gs::einsum<"BI,IH->BH">(x, t1)), t2);
  // A small start (as usual initialisations) keeps tanh out of saturation.
  W1 w1 = gs::random_normal<W1>(mesh, {3, 8}, 4) * 0.3;
  W2 w2 = gs::random_normal<W2>(mesh, {8, 2}, 5) * 0.3;
  gs::track(std::tie(w1, w2));
  const int steps = 1500;
  gs::nn::Adam opt({.learning_rate = gs::nn::cosine(0.02, 10, steps)});
  double first = 0, last = 0;
  for (int step = 0; step < steps; ++step) {
    auto out = gs::einsum<"BH,HO->BO">(gs::tanh(gs::einsum<"BI,IH->BH">(x, w1)), w2);
    auto err = out - y;
    const auto loss = (gs::einsum<"BO,BO->">(err, err) * (1.0 / 64)).eval();
    auto [g1, g2] = gs::grad(loss, std::tie(w1, w2));
    const double l = loss.to_global()[0];
    if (step == 0) first = l;
    last = l;
    opt.step(std::tie(w1, w2), std::tie(g1, g2));
  }
  INFO("loss " << first << " -> " << last);
  CHECK(last < 1e-3 * first);
}

}  // namespace
