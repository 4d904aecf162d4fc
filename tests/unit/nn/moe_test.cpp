// The MoE layer (nn/moe.hpp) against the naive single-rank loops of Algorithm 1
// (tests/support/moe_reference.hpp) and against its own dense-einsum path, on every listed mesh
// shape: outputs, losses, statistics and routing with capacity overflow and groups of unequal
// fill, top-1, top-2 (every second-expert policy) and top-3, E dividing the expert axes and E
// smaller than them; gradients dense vs index and against finite differences; AllToAll counts.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/nn/moe.hpp>
#include <gshard/ops/random.hpp>
// clang-format on

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "grad_checks.hpp"
#include "moe_cases.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
namespace ref = gshard::test::moe_ref;
using gshard::test::fd_relative_error;
using gshard::test::make;
using gshard::test::on_every_mesh;
using namespace gshard::test::moe_cases;

// Groups over every axis, experts over every axis but the first (as "data" x "expert").
template <class M>
struct Types {
  static constexpr bool three = M::axis_count == 3;
  using X = std::conditional_t<three, gs::Sharded<double, M, "G:x*y*z S M">,
                               gs::Sharded<double, M, "G:x*y S M">>;
  using Wg = gs::Sharded<double, M, "M E">;
  using Wi = std::conditional_t<three, gs::Sharded<double, M, "E:y*z M H">,
                                gs::Sharded<double, M, "E:y M H">>;
  using Wo = std::conditional_t<three, gs::Sharded<double, M, "E:y*z H M">,
                                gs::Sharded<double, M, "E:y H M">>;
};

template <class M>
using In = Inputs<Types<M>>;

template <class M>
void forward_case(const M& mesh, const Case& c) {
  INFO("k " << c.k << " capacity factor " << c.capacity_factor << " policy "
            << static_cast<int>(c.policy) << " E " << c.e);
  const In<M> in(mesh, c);
  const auto got = gs::nn::moe(in.x, in.wg, in.wi, in.wo, options(c));
  const auto dense = gs::nn::moe(in.x, in.wg, in.wi, in.wo, options(c, false, true));

  const ref::Result want = reference(mesh, in, c);

  CHECK(got.capacity == want.C);
  const auto out = got.output.to_global();
  CHECK(max_abs(out, want.out) < 1e-10);
  CHECK(max_abs(dense.output.to_global(), out) < 1e-12);
  CHECK(std::abs(got.aux_loss.to_global()[0] - want.aux_loss) < 1e-12);
  CHECK(std::abs(dense.aux_loss.to_global()[0] - want.aux_loss) < 1e-12);
  CHECK(std::abs(got.z_loss.to_global()[0] - want.router_z) < 1e-10);
  CHECK(got.tokens_per_expert == want.stats.tokens_per_expert);
  CHECK(std::abs(got.dropped_fraction - want.stats.dropped_fraction) < 1e-12);
  // The case must exercise what it claims: drops happen where the capacity is tight.
  if (c.capacity_factor <= 1.0) CHECK(want.stats.dropped_by_capacity > 0);
}

template <class M>
auto loss_function(const Case& c, bool dense, const typename Types<M>::X& r) {
  using TT = Types<M>;
  return [c, dense, r](const typename TT::X& x, const typename TT::Wg& wg,
                       const typename TT::Wi& wi, const typename TT::Wo& wo) {
    const auto res = gs::nn::moe(x, wg, wi, wo, options(c, false, dense));
    return (gs::einsum<"GSM,GSM->">(res.output, r) + res.aux_loss * 0.5 + res.z_loss * 0.25).eval();
  };
}

// The gradients of x, wg, wi, wo (global vectors) on `mesh`, by the index or the dense path.
template <class M>
std::vector<std::vector<double>> gradients(const M& mesh, const Case& c, bool dense) {
  In<M> in(mesh, c);
  const auto r = make<typename Types<M>::X>(mesh, {c.g, c.s, c.m}, 9);
  gs::track(std::tie(in.x, in.wg, in.wi, in.wo));
  const auto g = gs::grad(loss_function<M>(c, dense, r)(in.x, in.wg, in.wi, in.wo),
                          std::tie(in.x, in.wg, in.wi, in.wo));
  return {std::get<0>(g).to_global(), std::get<1>(g).to_global(), std::get<2>(g).to_global(),
          std::get<3>(g).to_global()};
}

using Self = gs::Mesh<"x", "y">;
Self self_mesh() { return Self(MPI_COMM_SELF, {1, 1}); }

const std::vector<Case> cases = {
    // G uneven on every mesh; S * k assignments over E * C slots.
    {6, 6, 3, 4, 4, 2, 1.0, gs::nn::SecondExpert::random, true},
    {6, 6, 3, 4, 4, 2, 2.0, gs::nn::SecondExpert::all, false},
    {6, 6, 3, 4, 4, 2, 1.0, gs::nn::SecondExpert::sampling, false},
    {6, 6, 3, 4, 4, 1, 1.0, gs::nn::SecondExpert::all, true},
    {5, 7, 3, 3, 4, 3, 1.0, gs::nn::SecondExpert::all, false},   // E = 3: uneven expert blocks
    {3, 8, 3, 2, 3, 2, 0.75, gs::nn::SecondExpert::all, false},  // E = 2 < expert axis at 8
};

TEST_CASE("the MoE layer equals the naive loops and the dense einsums on every mesh") {
  for (const Case& c : cases) forward_case(self_mesh(), c);
  on_every_mesh([](const auto& mesh) {
    for (const Case& c : cases) forward_case(mesh, c);
  });
}

TEST_CASE("MoE gradients on one rank equal central finite differences") {
  // The routing is piecewise constant in the inputs; these inputs sit away from its jumps.
  const Self self = self_mesh();
  for (const Case& c : cases) {
    if (!c.fd) continue;
    INFO("k " << c.k << " policy " << static_cast<int>(c.policy));
    In<Self> in(self, c);
    const auto r = make<Types<Self>::X>(self, {c.g, c.s, c.m}, 9);
    CHECK(fd_relative_error(loss_function<Self>(c, false, r), in.x, in.wg, in.wi, in.wo) < 1e-6);
  }
}

TEST_CASE("MoE gradients on every mesh: index path = dense path = one rank") {
  std::vector<std::vector<std::vector<double>>> want;
  for (const Case& c : cases) want.push_back(gradients(self_mesh(), c, false));
  on_every_mesh([&](const auto& mesh) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      INFO("k " << c.k << " policy " << static_cast<int>(c.policy) << " E " << c.e);
      const auto index = gradients(mesh, c, false);
      const auto dense = gradients(mesh, c, true);
      for (std::size_t t = 0; t < index.size(); ++t) {
        CHECK(max_abs(index[t], want[i][t]) < 1e-10);
        CHECK(max_abs(dense[t], want[i][t]) < 1e-10);
      }
    }
  });
}

TEST_CASE("the index path moves tokens with one AllToAll each way, the backward likewise") {
  using M = gs::Mesh<"x", "y">;
  for (const auto& s : gshard::test::listed_mesh_shapes(gshard::test::world_size())) {
    if (s.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(s));
    const M mesh = gshard::test::mesh_of<M>(s);
    const Case c{16, 8, 4, 8, 4, 2, 2.0, gs::nn::SecondExpert::all, false};
    In<M> in(mesh, c);
    gs::track(in.x);
    gs::comm_counters().reset();
    const auto res = gs::nn::moe(in.x, in.wg, in.wi, in.wo, options(c));
    const auto forward = gs::comm_counters().get("y", gs::Collective::all_to_all);
    const auto loss = gs::einsum<"GSM->">(res.output).eval();
    gs::comm_counters().reset();
    const auto g = gs::grad(loss, in.x);
    const auto backward = gs::comm_counters().get("y", gs::Collective::all_to_all);
    CHECK(forward.calls == (s[1] > 1 ? 2 : 0));
    CHECK(backward.calls == forward.calls);
    CHECK(backward.bytes == forward.bytes);
  }
}

}  // namespace
