// Dropless routing of the MoE layer (MoeOptions::dropless, nn/moe_dropless.hpp) against the naive
// loops of tests/support/moe_reference.hpp with a capacity that drops nothing (C = S), on every
// listed mesh shape and two placements: tokens split over the expert axis (one AllToAllv each
// way) and tokens replicated along it (no exchange, outputs summed over the copies). Uneven
// experts per rank (E = 3 over 2, E = 2 over 8), top-1/2/3 and the second-expert policies;
// gradients against the capacity path and finite differences; exact rows on the wire; the
// user's row limit.
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

// Split: groups over every axis, experts over every axis but the first (the exchange runs over
// the expert axes). Replicated: groups over the first axis only, so the tokens are the same along
// the expert axes and each copy computes its experts' share.
template <class M, bool Split>
struct Types {
  static constexpr bool three = M::axis_count == 3;
  using X = std::conditional_t<Split,
                               std::conditional_t<three, gs::Sharded<double, M, "G:x*y*z S M">,
                                                  gs::Sharded<double, M, "G:x*y S M">>,
                               gs::Sharded<double, M, "G:x S M">>;
  using Wg = gs::Sharded<double, M, "M E">;
  using Wi = std::conditional_t<three, gs::Sharded<double, M, "E:y*z M H">,
                                gs::Sharded<double, M, "E:y M H">>;
  using Wo = std::conditional_t<three, gs::Sharded<double, M, "E:y*z H M">,
                                gs::Sharded<double, M, "E:y H M">>;
};

template <class M, bool Split>
using In = Inputs<Types<M, Split>>;

// C = S (capacity factor E): the capacity path drops nothing either, so its values are dropless's.
const std::vector<Case> cases = {
    {6, 6, 3, 4, 4, 2, 4, gs::nn::SecondExpert::random},
    {6, 6, 3, 4, 4, 2, 4, gs::nn::SecondExpert::all},
    {6, 6, 3, 4, 4, 2, 4, gs::nn::SecondExpert::sampling},
    {6, 6, 3, 4, 4, 1, 4, gs::nn::SecondExpert::all},
    {5, 7, 3, 3, 4, 3, 3, gs::nn::SecondExpert::all},  // E = 3: uneven expert blocks
    {3, 8, 3, 2, 3, 2, 2, gs::nn::SecondExpert::all},  // E = 2: ranks without experts
};

template <bool Split, class M>
void forward_case(const M& mesh, const Case& c) {
  INFO("k " << c.k << " policy " << static_cast<int>(c.policy) << " E " << c.e << " split "
            << Split);
  const In<M, Split> in(mesh, c);
  const auto got = gs::nn::moe(in.x, in.wg, in.wi, in.wo, options(c, true));
  const ref::Result want = reference(mesh, in, c);
  CHECK(want.stats.dropped_by_capacity == 0);
  CHECK(got.capacity == 0);
  CHECK(max_abs(got.output.to_global(), want.out) < 1e-10);
  CHECK(std::abs(got.aux_loss.to_global()[0] - want.aux_loss) < 1e-12);
  CHECK(std::abs(got.z_loss.to_global()[0] - want.router_z) < 1e-10);
  CHECK(got.tokens_per_expert == want.stats.tokens_per_expert);
  CHECK(got.dropped_fraction == 0.0);
}

template <class M, bool Split>
auto loss_function(const Case& c, bool dropless, const typename Types<M, Split>::X& r) {
  using TT = Types<M, Split>;
  return [c, dropless, r](const typename TT::X& x, const typename TT::Wg& wg,
                          const typename TT::Wi& wi, const typename TT::Wo& wo) {
    const auto res = gs::nn::moe(x, wg, wi, wo, options(c, dropless));
    return (gs::einsum<"GSM,GSM->">(res.output, r) + res.aux_loss * 0.5 + res.z_loss * 0.25).eval();
  };
}

template <bool Split, class M>
std::vector<std::vector<double>> gradients(const M& mesh, const Case& c, bool dropless) {
  In<M, Split> in(mesh, c);
  const auto r = make<typename Types<M, Split>::X>(mesh, {c.g, c.s, c.m}, 9);
  gs::track(std::tie(in.x, in.wg, in.wi, in.wo));
  const auto g = gs::grad(loss_function<M, Split>(c, dropless, r)(in.x, in.wg, in.wi, in.wo),
                          std::tie(in.x, in.wg, in.wi, in.wo));
  return {std::get<0>(g).to_global(), std::get<1>(g).to_global(), std::get<2>(g).to_global(),
          std::get<3>(g).to_global()};
}

using Self = gs::Mesh<"x", "y">;
Self self_mesh() { return Self(MPI_COMM_SELF, {1, 1}); }

TEST_CASE("dropless MoE equals the naive loops with nothing dropped, on every mesh") {
  for (const Case& c : cases) forward_case<true>(self_mesh(), c);
  on_every_mesh([](const auto& mesh) {
    for (const Case& c : cases) {
      forward_case<true>(mesh, c);
      forward_case<false>(mesh, c);
    }
  });
}

TEST_CASE("dropless MoE gradients equal finite differences on one rank") {
  const Self self = self_mesh();
  for (const Case& c : cases) {
    if (c.policy != gs::nn::SecondExpert::random && c.k != 1) continue;
    INFO("k " << c.k);
    In<Self, true> in(self, c);
    const auto r = make<Types<Self, true>::X>(self, {c.g, c.s, c.m}, 9);
    CHECK(fd_relative_error(loss_function<Self, true>(c, true, r), in.x, in.wg, in.wi, in.wo) <
          1e-6);
  }
}

TEST_CASE("dropless MoE gradients on every mesh equal the capacity path's on one rank") {
  std::vector<std::vector<std::vector<double>>> want;
  for (const Case& c : cases) want.push_back(gradients<true>(self_mesh(), c, false));
  on_every_mesh([&](const auto& mesh) {
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      INFO("k " << c.k << " policy " << static_cast<int>(c.policy) << " E " << c.e);
      const auto split = gradients<true>(mesh, c, true);
      const auto replicated = gradients<false>(mesh, c, true);
      for (std::size_t t = 0; t < split.size(); ++t) {
        CHECK(max_abs(split[t], want[i][t]) < 1e-10);
        CHECK(max_abs(replicated[t], want[i][t]) < 1e-10);
      }
    }
  });
}

TEST_CASE(
    "dropless MoE sends exactly the routed rows: one AllToAll of counts, one AllToAllv "
    "each way, the backward likewise") {
  using M = gs::Mesh<"x", "y">;
  for (const auto& sz : gshard::test::listed_mesh_shapes(gshard::test::world_size())) {
    if (sz.size() != 2) continue;
    INFO("mesh " << gshard::test::sizes_text(sz));
    const M mesh = gshard::test::mesh_of<M>(sz);
    const Case c{16, 8, 4, 8, 4, 2, 8, gs::nn::SecondExpert::all};
    In<M, true> in(mesh, c);
    const ref::Result want = reference(mesh, in, c);
    gs::track(in.x);
    gs::comm_counters().reset();
    const auto res = gs::nn::moe(in.x, in.wg, in.wi, in.wo, options(c, true));
    const auto counts = gs::comm_counters().get("y", gs::Collective::all_to_all);
    const auto forward = gs::comm_counters().get("y", gs::Collective::all_to_all_v);
    const auto loss = gs::einsum<"GSM->">(res.output).eval();
    gs::comm_counters().reset();
    const auto g = gs::grad(loss, in.x);
    const auto backward = gs::comm_counters().get("y", gs::Collective::all_to_all_v);
    const bool exchange = sz[1] > 1;
    CHECK(counts.calls == (exchange ? 1 : 0));
    CHECK(forward.calls == (exchange ? 2 : 0));
    CHECK(backward.calls == forward.calls);
    CHECK(backward.bytes == forward.bytes);
    // Rows crossing ranks: assignments whose token's y coordinate is not its expert's.
    const std::int64_t gchunk = (c.g + sz[0] * sz[1] - 1) / (sz[0] * sz[1]);
    const std::int64_t echunk = (c.e + sz[1] - 1) / sz[1];
    std::int64_t crossing = 0;
    for (std::int64_t t = 0; t < c.g * c.s; ++t)
      for (int j = 0; j < c.k; ++j) {
        const std::int64_t e = want.routing.expert[static_cast<std::size_t>(t * c.k + j)];
        const std::int64_t ty = (t / c.s / gchunk) % sz[1];
        if (e >= 0 && ty != e / echunk) ++crossing;
      }
    std::int64_t bytes = forward.bytes;
    MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
    // Counted once per rank per AllToAllv; every copy along x sends its own groups.
    CHECK(bytes == 2 * crossing * c.m * static_cast<std::int64_t>(sizeof(double)));
  }
}

TEST_CASE("dropless MoE over the user's row limit throws on every rank alike") {
  on_every_mesh([](const auto& mesh) {
    using M = std::decay_t<decltype(mesh)>;
    const Case c{6, 6, 3, 4, 4, 2, 4, gs::nn::SecondExpert::all};
    const In<M, true> in(mesh, c);
    gs::nn::MoeOptions o = options(c, true);
    o.dropless_max_rows = 1;  // some rank receives more
    CHECK_THROWS_AS(gs::nn::moe(in.x, in.wg, in.wi, in.wo, o), gs::Error);
    o.dropless_max_rows = c.g * c.s * c.k;  // the worst case fits
    const auto got = gs::nn::moe(in.x, in.wg, in.wi, in.wo, o);
    const auto want = gs::nn::moe(in.x, in.wg, in.wi, in.wo, options(c, false));
    CHECK(max_abs(got.output.to_global(), want.output.to_global()) < 1e-12);
    o.dropless_max_rows = -1;
    CHECK_THROWS_AS(gs::nn::moe(in.x, in.wg, in.wi, in.wo, o), gs::Error);
    o.dropless_max_rows = 0;
    o.dense = true;
    CHECK_THROWS_AS(gs::nn::moe(in.x, in.wg, in.wi, in.wo, o), gs::Error);
  });
}

}  // namespace

namespace {

// Experts over two axes, so the exchange spans two: x*y (two axes) or y*z (three).
template <class M>
struct TwoLevel {
  static constexpr bool three = M::axis_count == 3;
  using X = std::conditional_t<three, gs::Sharded<double, M, "G:x*y*z S M">,
                               gs::Sharded<double, M, "G:x*y S M">>;
  using Wg = gs::Sharded<double, M, "M E">;
  using Wi = std::conditional_t<three, gs::Sharded<double, M, "E:y*z M H">,
                                gs::Sharded<double, M, "E:x*y M H">>;
  using Wo = std::conditional_t<three, gs::Sharded<double, M, "E:y*z H M">,
                                gs::Sharded<double, M, "E:x*y H M">>;
};

TEST_CASE("dropless MoE with the hierarchical exchange equals the flat one bit for bit") {
  on_every_mesh([](const auto& mesh) {
    using M = std::decay_t<decltype(mesh)>;
    using TT = TwoLevel<M>;
    constexpr bool three = M::axis_count == 3;
    const std::string outer = three ? "y" : "x", inner = three ? "z" : "y";
    for (const Case& c : cases) {
      INFO("k " << c.k << " E " << c.e);
      auto x = make<typename TT::X>(mesh, {c.g, c.s, c.m}, 1);
      auto wg = make<typename TT::Wg>(mesh, {c.m, c.e}, 2);
      auto wi = make<typename TT::Wi>(mesh, {c.e, c.m, c.h}, 3);
      auto wo = make<typename TT::Wo>(mesh, {c.e, c.h, c.m}, 4);
      const auto r = make<typename TT::X>(mesh, {c.g, c.s, c.m}, 9);
      gs::track(std::tie(x, wg, wi, wo));
      std::vector<std::vector<double>> got[2];
      for (int hier = 0; hier < 2; ++hier) {
        gs::nn::MoeOptions o = options(c, true);
        o.hierarchical = hier == 1;
        gs::comm_counters().reset();
        const auto res = gs::nn::moe(x, wg, wi, wo, o);
        const auto loss = (gs::einsum<"GSM,GSM->">(res.output, r) + res.aux_loss * 0.5).eval();
        const auto g = gs::grad(loss, std::tie(x, wg, wi, wo));
        got[hier] = {res.output.to_global(), std::get<0>(g).to_global(), std::get<1>(g).to_global(),
                     std::get<2>(g).to_global(), std::get<3>(g).to_global()};
        const auto per_outer = gs::comm_counters().get(outer, gs::Collective::all_to_all_v);
        const auto per_inner = gs::comm_counters().get(inner, gs::Collective::all_to_all_v);
        const int n_outer = mesh.axis_size(three ? 1 : 0), n_inner = mesh.axis_size(three ? 2 : 1);
        // Four row exchanges (dispatch, combine, and both in the backward), each one step per
        // level of more than one rank; the flat exchange counts under both axes together.
        CHECK(per_outer.calls == (hier == 1 && n_outer > 1 ? 4 : 0));
        CHECK(per_inner.calls == (hier == 1 && n_inner > 1 ? 4 : 0));
      }
      for (std::size_t t = 0; t < got[0].size(); ++t) CHECK(got[0][t] == got[1][t]);
      // And the values are the layer's: the capacity path with nothing dropped.
      const auto want = gs::nn::moe(x, wg, wi, wo, options(c, false));
      CHECK(max_abs(got[0][0], want.output.to_global()) < 1e-10);
    }
  });
}

}  // namespace

namespace {

TEST_CASE("selection bias: experts chosen by gates + bias, outputs mixed by the gates alone") {
  on_every_mesh([](const auto& mesh) {
    using M = std::decay_t<decltype(mesh)>;
    for (const Case& c : cases) {
      if (c.policy == gs::nn::SecondExpert::sampling) continue;  // samples unbiased gates
      INFO("k " << c.k << " E " << c.e);
      const In<M, true> in(mesh, c);
      std::vector<double> bias(static_cast<std::size_t>(c.e));
      for (std::size_t i = 0; i < bias.size(); ++i) bias[i] = 0.15 * static_cast<double>(i % 3);
      const ref::Problem p = problem(mesh, in, c);
      for (const bool dropless : {false, true}) {
        INFO("dropless " << dropless);
        Case cc = c;
        if (!dropless) cc.capacity_factor = 1.0;  // the capacity path drops some
        gs::nn::MoeOptions mo = options(cc, dropless);
        mo.selection_bias = bias;
        const ref::Result want = ref::moe_layer(p, reference_options(cc, bias));
        const auto got = gs::nn::moe(in.x, in.wg, in.wi, in.wo, mo);
        CHECK(max_abs(got.output.to_global(), want.out) < 1e-10);
        CHECK(got.tokens_per_expert == want.stats.tokens_per_expert);
        CHECK(std::abs(got.aux_loss.to_global()[0] - want.aux_loss) < 1e-12);
        // The bias matters here: without it the choices differ.
        CHECK(ref::moe_layer(p, reference_options(cc)).routing.choice != want.routing.choice);
      }
      gs::nn::MoeOptions bad = options(c, true);
      bad.selection_bias.assign(static_cast<std::size_t>(c.e + 1), 0.0);
      CHECK_THROWS_AS(gs::nn::moe(in.x, in.wg, in.wi, in.wo, bad), gs::Error);
    }
  });
}

TEST_CASE("balance_selection_bias moves each bias toward the mean load") {
  std::vector<double> bias;
  gs::nn::balance_selection_bias(bias, {5, 1, 3, 3}, 0.01);
  CHECK(bias == std::vector<double>{-0.01, 0.01, 0.0, 0.0});
  gs::nn::balance_selection_bias(bias, {2, 2, 7, 1}, 0.5);  // mean 3
  CHECK(bias == std::vector<double>{0.49, 0.51, -0.5, 0.5});
  CHECK_THROWS_AS(gs::nn::balance_selection_bias(bias, {1, 2, 3}, 0.1), gs::Error);
}

TEST_CASE("bias balancing evens out a skewed router over steps, with no loss term") {
  on_every_mesh([](const auto& mesh) {
    using M = std::decay_t<decltype(mesh)>;
    using TT = Types<M, true>;
    const Case c{8, 16, 4, 8, 4, 2, 8, gs::nn::SecondExpert::all};
    const In<M, true> in(mesh, c);
    // Two hot experts: a constant first feature, which their router columns weigh heavily; the
    // other features keep the tokens diverse.
    auto x_host = in.x.to_global();
    for (std::int64_t t = 0; t < c.g * c.s; ++t) x_host[static_cast<std::size_t>(t * c.m)] = 1.0;
    const auto x = gs::from_global<typename TT::X>(mesh, {c.g, c.s, c.m}, x_host);
    auto wg_host = in.wg.to_global();
    for (std::int64_t e : {1, 5}) wg_host[static_cast<std::size_t>(e)] += 2.0;
    const auto wg = gs::from_global<typename TT::Wg>(mesh, {c.m, c.e}, wg_host);
    const auto imbalance = [&](const std::vector<std::int64_t>& n) {
      double mean = 0, most = 0;
      for (auto v : n)
        mean += static_cast<double>(v), most = std::max(most, static_cast<double>(v));
      return most / (mean / static_cast<double>(n.size()));
    };
    gs::nn::MoeOptions o = options(c, true);
    const auto first = gs::nn::moe(x, wg, in.wi, in.wo, o).tokens_per_expert;
    const double before = imbalance(first);
    const double mean_load = static_cast<double>(c.g * c.s * c.k) / static_cast<double>(c.e);
    // DeepSeek-V3's small constant rate; the last 50 of 200 steps are averaged (sign updates
    // keep the loads moving around the balance).
    double late = 0, hot = 0;
    for (int step = 0; step < 200; ++step) {
      const auto res = gs::nn::moe(x, wg, in.wi, in.wo, o);
      if (step >= 150) {
        late += imbalance(res.tokens_per_expert) / 50;
        hot += static_cast<double>(res.tokens_per_expert[1] + res.tokens_per_expert[5]) / 100;
      }
      gs::nn::balance_selection_bias(o.selection_bias, res.tokens_per_expert, 0.003);
    }
    INFO("imbalance (max / mean load) " << before << " before, " << late << " late; hot experts "
                                        << first[1] << ", " << first[5] << " before, " << hot
                                        << " late (mean " << mean_load << ")");
    CHECK(static_cast<double>(first[1] + first[5]) / 2 > 1.5 * mean_load);
    CHECK(late < 0.85 * before);
    CHECK(hot < 1.1 * mean_load);
    // Every rank holds the same bias (it only depends on global counts).
    std::vector<double> mine = o.selection_bias, root = mine;
    MPI_Bcast(root.data(), static_cast<int>(root.size()), MPI_DOUBLE, 0, MPI_COMM_WORLD);
    CHECK(mine == root);
  });
}

}  // namespace
