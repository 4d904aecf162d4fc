// Conversions and in-place updates (docs/design.md, "Conversions" and "Handles, laziness and
// in-place updates"): a layout change that moves no data converts implicitly and sends nothing;
// one that communicates is written reshard<Target>(x) (tests/compile_fail/conversion_* show the
// rest); evaluating an expression into a declared layout reshards where explain and the trace
// say, at the user's line. An expression built over a tensor that is then updated in place
// (optimizer step, clip, reshard_into, mark_modified) refuses to produce a value, whether or not
// it was evaluated before, on every rank alike; values evaluated before keep the old value.
// References: naive loops over to_global of the inputs.
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "errors.hpp"
#include "mpi_test.hpp"

#include <gshard/comm/counters.hpp>
#include <gshard/expr/explain.hpp>
#include <gshard/nn/clip.hpp>
#include <gshard/nn/optimizers.hpp>
#include <gshard/trace/timeline.hpp>

namespace {

namespace gs = gshard;
using gshard::test::world_size;
using M = gs::Mesh<"x", "y">;

std::vector<std::vector<int>> mesh_shapes() {
  const int n = world_size();
  std::vector<std::vector<int>> out{{1, n}, {n, 1}};
  if (n % 2 == 0 && n > 2) out.push_back({2, n / 2});
  return out;
}

std::vector<double> values(std::size_t n, double salt) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = std::sin(0.37 * static_cast<double>(i) + salt);
  return v;
}

std::int64_t total_calls() {
  std::int64_t calls = 0;
  for (const auto& [key, c] : gs::comm_counters().all()) calls += c.calls;
  return calls;
}

std::string site(int line) { return "handles_test.cpp:" + std::to_string(line); }

constexpr std::int64_t I = 7, J = 5;  // uneven over every mesh axis size we test

}  // namespace

TEST_CASE("conversions: moving no data is implicit, communicating is written reshard") {
  for (const auto& sizes : mesh_shapes()) {
    const M mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    INFO("mesh ", sizes[0], "x", sizes[1]);
    using Full = gs::Sharded<double, M, "I J">;
    using Rows = gs::Sharded<double, M, "I:x J">;
    using Cols = gs::Sharded<double, M, "I J:y">;
    const std::vector<double> g = values(I * J, 0.5);
    const Full full = gs::from_global<Full>(mesh, {I, J}, g);

    // Replicated -> split: a local slice, implicit, no collective.
    gs::comm_counters().reset();
    const Rows rows = full;
    CHECK(total_calls() == 0);
    CHECK(rows.to_global() == g);

    // Split -> other split: a collective, so written out; the same value.
    static_assert(!gs::detail::no_communication(Rows::layout, Cols::layout));
    gs::comm_counters().reset();
    const auto cols = gs::reshard<Cols>(rows);
    CHECK((total_calls() > 0) == (mesh.size() > 1));  // a collective (sizes do not matter)
    CHECK(cols.to_global() == g);
  }
}

TEST_CASE("conversions: evaluating into a declared layout is in explain and the trace") {
  for (const auto& sizes : mesh_shapes()) {
    const M mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    INFO("mesh ", sizes[0], "x", sizes[1]);
    using Rows = gs::Sharded<double, M, "I:x J">;
    using Cols = gs::Sharded<double, M, "I J:y">;
    const std::vector<double> g = values(I * J, 1.5);
    const Rows a = gs::from_global<Rows>(mesh, {I, J}, g);
    const auto twice = a * 2.0;

    const int line_explain = __LINE__ + 1;
    const std::string plan = gs::explain<Cols>(twice);
    INFO(plan);
    CHECK((plan.find("evaluate into the declared layout \"I J:y\"   at " + site(line_explain)) !=
           std::string::npos) == true);
    CHECK((plan.find("reshard \"I:x J\" -> \"I J:y\"") != std::string::npos) == true);
    CHECK(gs::explain<Rows>(twice).find("declared layout") == std::string::npos);

    gs::Trace t(mesh);
    t.begin_step();
    const int line_declared = __LINE__ + 1;
    const Cols c = twice;
    t.end_step();
    int at_line = 0;
    for (const auto& e : t.events())
      if (std::string(e.category) == "collective") {
        INFO(e.name, " at ", gs::detail::trace_site(e.file, e.line), " for ", e.op);
        CHECK(gs::detail::trace_site(e.file, e.line) == site(line_declared));
        ++at_line;
      }
    CHECK((at_line > 0) == (mesh.size() > 1));
    const std::vector<double> got = c.to_global();
    for (std::size_t i = 0; i < g.size(); ++i) CHECK(got[i] == 2.0 * g[i]);
  }
}

TEST_CASE("in-place updates: a stale expression throws on every rank, old values stay") {
  for (const auto& sizes : mesh_shapes()) {
    const M mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    INFO("mesh ", sizes[0], "x", sizes[1]);
    using W = gs::Sharded<double, M, "I:x J:y">;
    const std::vector<double> gw = values(I * J, 2.5), gg = values(I * J, 3.5);
    W w = gs::from_global<W>(mesh, {I, J}, gw);
    W grad = gs::from_global<W>(mesh, {I, J}, gg);
    gs::nn::Sgd opt(gs::nn::SgdOptions{.learning_rate = 0.5});

    const auto never = w * 2.0;          // not evaluated before the step
    const auto early = w * 3.0;          // evaluated before the step
    const W early_value = early;         // holds w as it was
    const W alias = w;                   // a handle: the same shard and version
    const auto via_alias = alias + 1.0;  // built over the handle
    const auto relabelled = w.as<"AB">() * 1.0;
    const auto contracted = gs::einsum<"IJ,IJ->J">(w, grad);
    CHECK(w.version() == 0);

    const int line_step = __LINE__ + 1;
    opt.step(std::tie(w), std::tie(grad));
    CHECK(w.version() == 1);
    CHECK(alias.version() == 1);

    const std::string expected = "updated in place";
    const std::string text = gs::test::same_error_everywhere([&] { const W z = never; }, expected);
    CHECK(text.find("Sgd at " + site(line_step)) != std::string::npos);
    gs::test::same_error_everywhere([&] { const W z = early; }, expected);
    gs::test::same_error_everywhere([&] { (void)early.to_global(); }, expected);
    gs::test::same_error_everywhere([&] { (void)via_alias.eval(); }, expected);
    gs::test::same_error_everywhere([&] { (void)relabelled.eval(); }, expected);
    gs::test::same_error_everywhere([&] { (void)contracted.eval(); }, expected);
    gs::test::same_error_everywhere([&] { (void)(never + 1.0).eval(); }, expected);

    // What was evaluated before keeps the old value; a rebuilt expression reads the new one.
    const std::vector<double> old_value = early_value.to_global(), now = w.to_global();
    const std::vector<double> rebuilt = (w * 3.0).to_global();
    for (std::size_t i = 0; i < gw.size(); ++i) {
      CHECK(old_value[i] == 3.0 * gw[i]);
      CHECK(now[i] == doctest::Approx(gw[i] - 0.5 * gg[i]).epsilon(1e-14));
      CHECK(rebuilt[i] == 3.0 * now[i]);
    }
  }
}

TEST_CASE("in-place updates: clip, reshard_into and mark_modified move the version") {
  for (const auto& sizes : mesh_shapes()) {
    const M mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    INFO("mesh ", sizes[0], "x", sizes[1]);
    using Rows = gs::Sharded<double, M, "I:x J">;
    using Cols = gs::Sharded<double, M, "I J:y">;
    const std::vector<double> g = values(I * J, 4.5);
    Rows a = gs::from_global<Rows>(mesh, {I, J}, g);
    Cols target = gs::zeros<Cols>(mesh, {I, J});

    const auto over_a = a * 1.0;
    const auto over_target = target + 1.0;
    double norm = 0;
    for (double v : g) norm += v * v;
    (void)gs::nn::clip_by_global_norm(std::tie(a), 0.5 * std::sqrt(norm));
    CHECK(a.version() == 1);
    gs::test::same_error_everywhere([&] { (void)over_a.eval(); }, "clip_by_global_norm at");

    const int line_into = __LINE__ + 1;
    gs::reshard_into(a, target);
    CHECK(target.version() == 1);
    gs::test::same_error_everywhere([&] { (void)over_target.eval(); },
                                    "reshard_into at " + site(line_into));

    // Writing through local_view, then saying so.
    const auto over_local = a + 0.0;
    const auto host = Kokkos::create_mirror_view(a.local_view());
    Kokkos::deep_copy(host, a.local_view());
    for (std::size_t i = 0; i < host.extent(0); ++i) host(i) = -host(i);
    Kokkos::deep_copy(a.local_view(), host);
    const int line_marked = __LINE__ + 1;
    a.mark_modified();
    gs::test::same_error_everywhere([&] { (void)over_local.eval(); },
                                    "mark_modified at " + site(line_marked));
    const std::vector<double> got = (a + 0.0).to_global();
    for (std::size_t i = 0; i < g.size(); ++i)
      CHECK(got[i] == doctest::Approx(-0.5 * g[i]).epsilon(1e-14));
  }
}
