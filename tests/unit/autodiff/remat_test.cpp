// Rematerialisation (autodiff/checkpoint.hpp) and the memory discipline of the backward pass:
// gradients through checkpointed blocks against finite differences on every mesh shape and
// against the same model without checkpoints, the error for a block that hides a tracked
// tensor, and peak live bytes (Kokkos allocation hooks) during the backward pass of a 16-layer
// MLP, below a stated bound, lower with rematerialisation, and nothing left behind.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/autodiff/checkpoint.hpp>
#include <gshard/kernels/memory.hpp>
// clang-format on

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gshard::test::fd_relative_error;
using gshard::test::listed_mesh_shapes;
using gshard::test::make;
using gshard::test::mesh_of;
using gshard::test::on_every_mesh;
using gshard::test::world_size;

// A Megatron-style residual MLP block: h + tanh(h W1) W2, the hidden label over y.
template <class H, class W1, class W2>
H block(const H& h, const W1& w1, const W2& w2) {
  return h + gs::einsum<"BF,FD->BD">(gs::tanh(gs::einsum<"BD,DF->BF">(h, w1)), w2);
}

template <class M>
void checkpoint_cases(const M& mesh) {
  using D = double;
  using H = gs::Sharded<D, M, "B:x D">;
  using W1 = gs::Sharded<D, M, "D F:y">;
  using W2 = gs::Sharded<D, M, "F:y D">;
  const H r = make<H>(mesh, {5, 3}, 1);
  // Two checkpointed blocks, the second nested in a third checkpoint, the weights of the first
  // tracked and of the second not (inputs without nodes get no gradient).
  const W1 fixed1 = make<W1>(mesh, {3, 7}, 2);
  const W2 fixed2 = make<W2>(mesh, {7, 3}, 3);
  auto f = [&](const H& x, const W1& w1, const W2& w2) {
    auto step = [](const H& h, const W1& a, const W2& b) { return block(h, a, b); };
    H h = gs::checkpoint(step, std::tie(x, w1, w2));
    h = gs::checkpoint(
        [&](const H& in) { return gs::checkpoint(step, std::tie(in, fixed1, fixed2)) * 0.5; }, h);
    return gs::einsum<"BD,BD->">(h, r).eval();
  };
  CHECK(fd_relative_error(f, make<H>(mesh, {5, 3}, 4), make<W1>(mesh, {3, 7}, 5),
                          make<W2>(mesh, {7, 3}, 6)) < 1e-6);
}

TEST_CASE("gradients through checkpointed blocks equal finite differences on every mesh") {
  on_every_mesh([](const auto& mesh) { checkpoint_cases(mesh); });
}

// A 16-layer residual MLP (hidden over y, batch over x), each layer checkpointed or not.
template <class M>
struct Deep {
  using H = gs::Sharded<double, M, "B:x D">;
  using W1 = gs::Sharded<double, M, "D F:y">;
  using W2 = gs::Sharded<double, M, "F:y D">;
  static constexpr int layers = 16;
  std::vector<W1> w1;
  std::vector<W2> w2;
  H x, r;

  Deep(const M& mesh, gs::Shape::value_type batch, gs::Shape::value_type d, gs::Shape::value_type f)
      : x(gs::random_normal<H>(mesh, {batch, d}, 1)), r(gs::random_normal<H>(mesh, {batch, d}, 2)) {
    for (int l = 0; l < layers; ++l) {
      w1.push_back(gs::random_normal<W1>(mesh, {d, f}, 10 + 2 * static_cast<unsigned>(l)) * 0.2);
      w2.push_back(gs::random_normal<W2>(mesh, {f, d}, 11 + 2 * static_cast<unsigned>(l)) * 0.2);
      gs::track(std::tie(w1.back(), w2.back()));
    }
  }
  [[nodiscard]] auto loss(bool remat) const {
    H h = x;
    for (int l = 0; l < layers; ++l) {
      const auto i = static_cast<std::size_t>(l);
      if (remat)
        h = gs::checkpoint([](const H& a, const W1& b, const W2& c) { return block(a, b, c); },
                           std::tie(h, w1[i], w2[i]));
      else
        h = block(h, w1[i], w2[i]);
    }
    return gs::einsum<"BD,BD->">(h, r).eval();
  }
  // Gradients of all weights, as global vectors.
  [[nodiscard]] std::vector<std::vector<double>> gradients(bool remat) const {
    std::vector<std::vector<double>> out;
    for (int l = 0; l < layers; ++l) {
      const auto i = static_cast<std::size_t>(l);
      const auto [g1, g2] = gs::grad(loss(remat), std::tie(w1[i], w2[i]));
      out.push_back(g1.to_global());
      out.push_back(g2.to_global());
    }
    return out;
  }
};

TEST_CASE("checkpointing changes no gradient") {
  using M = gs::Mesh<"x", "y">;
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const Deep<M> net(mesh_of<M>(s), 9, 5, 7);
    const auto plain = net.gradients(false);
    const auto remat = net.gradients(true);
    double diff = 0, norm = 0;
    for (std::size_t t = 0; t < plain.size(); ++t)
      for (std::size_t i = 0; i < plain[t].size(); ++i) {
        diff = std::max(diff, std::abs(plain[t][i] - remat[t][i]));
        norm = std::max(norm, std::abs(plain[t][i]));
      }
    CHECK(norm > 0);
    CHECK(diff <= 1e-12 * norm);
  }
}

TEST_CASE("a block that reads a tracked tensor it was not given is refused on every rank") {
  using M = gs::Mesh<"x", "y">;
  const M mesh(MPI_COMM_WORLD, {world_size(), 1});
  using H = gs::Sharded<double, M, "B:x D">;
  H x = make<H>(mesh, {6, 3}, 1);
  H w = make<H>(mesh, {6, 3}, 2);
  gs::track(std::tie(x, w));
  const auto y = gs::checkpoint([&](const H& a) { return a * w; }, x);
  std::string why;
  try {
    (void)gs::grad(gs::einsum<"BD->">(y).eval(), std::tie(x, w));
  } catch (const gs::Error& e) {
    why = e.what();
  }
  CHECK(why.find("a tracked tensor it was not given as an input") != std::string::npos);
}

// Peak live bytes on this rank during the backward pass of the 16-layer MLP, and the live bytes
// left once the gradients are dropped, relative to before the forward pass.
struct Peak {
  std::int64_t forward_kept = 0;  // live after the forward pass
  std::int64_t backward_peak = 0;
  std::int64_t left = 0;
};

template <class M>
Peak measure(const Deep<M>& net, bool remat) {
  auto& mem = gs::memory_counters();
  const std::int64_t base = mem.live_bytes();
  Peak p;
  {
    const auto l = net.loss(remat);
    p.forward_kept = mem.live_bytes() - base;
    mem.reset_peak();
    {
      const auto g = gs::grad(l, std::tie(net.w1[0], net.w2[0], net.w1[15], net.w2[15]));
      p.backward_peak = mem.peak_bytes() - base;
    }
  }
  p.left = mem.live_bytes() - base;
  return p;
}

TEST_CASE("peak live bytes during the backward pass of a 16-layer MLP: bounded, lower with remat") {
  using M = gs::Mesh<"x", "y">;
  gs::memory_counters().enable();
  for (const auto& s : listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh = mesh_of<M>(s);
    // Activations dominate: B*D and B*F per rank are much larger than a layer's weights.
    const gs::Shape::value_type batch = 256, d = 16, f = 32;
    const Deep<M> net(mesh, batch, d, f);
    // A = one activation block "B:x D" on this rank; Af = one "B:x F:y" block.
    const std::int64_t a = 8 * ((batch + s[0] - 1) / s[0]) * d;
    const std::int64_t af = 8 * ((batch + s[0] - 1) / s[0]) * ((f + s[1] - 1) / s[1]);
    // The requested gradients (two W1 and two W2 blocks).
    const std::int64_t g = 2 * 2 * 8 * d * ((f + s[1] - 1) / s[1]);
    const Peak plain = measure(net, false);
    const Peak remat = measure(net, true);
    MESSAGE("mesh " << gshard::test::sizes_text(s) << ": A=" << a << " Af=" << af << " plain kept "
                    << plain.forward_kept << " peak " << plain.backward_peak << " left "
                    << plain.left << "; remat kept " << remat.forward_kept << " peak "
                    << remat.backward_peak << " left " << remat.left);
    // The bound. Without remat a layer keeps its input (A, for its first einsum), the hidden
    // pre-activation and activation (2 Af, for tanh and the second einsum) and the second
    // einsum's result (A, kept by the residual add's fused node). With remat a layer keeps only
    // its input. The backward pass adds at most one layer's cotangents (plain: 2 A + 2 Af) or
    // one rerun layer's graph (2 A + 2 Af) with its partial sums and cotangents (4 A + 2 Af),
    // plus the gradients: intermediates are freed as it goes, so the peak does not grow with
    // depth.
    const std::int64_t layers = Deep<M>::layers, slack = 4096;
    CHECK(plain.forward_kept <= layers * (2 * a + 2 * af) + 64);
    CHECK(remat.forward_kept <= layers * a + 64);
    CHECK(plain.backward_peak <= layers * (2 * a + 2 * af) + 2 * (a + af) + g + slack);
    CHECK(remat.backward_peak <= layers * a + 6 * a + 4 * af + g + slack);
    // Everything the graph held is freed once the loss and the gradients are gone.
    CHECK(remat.backward_peak < plain.backward_peak);
  }
}

}  // namespace
