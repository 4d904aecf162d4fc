// Traces and step plans: every collective a traced program runs is in the trace once, with the
// communication counters' kind, axes and bytes and the user's source line; the Chrome trace
// file merges all ranks; step plans agree with the counters per step; the backward pass is traced
// at the forward lines; nothing is recorded outside a traced step.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "errors.hpp"
#include "mpi_test.hpp"
// clang-format off
#include <gshard/autodiff/grad.hpp>
#include <gshard/trace/timeline.hpp>
#include <gshard/ops/reduce.hpp>
// clang-format on
#include "op_checks.hpp"

namespace {

namespace fs = std::filesystem;
using gshard::Sharded;
using gshard::test::world_rank;
using gshard::test::world_size;
using Key = std::pair<std::string, std::string>;  // kind, axes

std::vector<double> values(std::int64_t n, int salt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(i)] = static_cast<double>((i * 7 + salt * 3) % 11) - 5.0;
  return v;
}

std::string site(int line) { return "timeline_test.cpp:" + std::to_string(line); }

// The counters' collectives (calls, bytes) by kind and axes.
std::map<Key, std::pair<std::int64_t, std::int64_t>> counted() {
  std::map<Key, std::pair<std::int64_t, std::int64_t>> out;
  for (const auto& [key, c] : gshard::comm_counters().all())
    if (c.calls > 0) out[{gshard::collective_name(key.second), key.first}] = {c.calls, c.bytes};
  return out;
}

// The trace's collectives, the same way.
std::map<Key, std::pair<std::int64_t, std::int64_t>> traced(const gshard::Trace& t) {
  std::map<Key, std::pair<std::int64_t, std::int64_t>> out;
  for (const auto& e : t.events())
    if (std::string(e.category) == "collective") {
      auto& c = out[{e.name, e.axes}];
      c.first += 1;
      c.second += e.bytes;
    }
  return out;
}

template <class V>
std::string text(const std::map<Key, std::pair<V, V>>& m) {
  std::string s;
  for (const auto& [k, v] : m)
    s += k.first + " over " + k.second + ": " + std::to_string(v.first) + " calls, " +
         std::to_string(v.second) + " bytes; ";
  return s;
}

template <class MeshT>
void check_traced_program(const MeshT& mesh) {
  using A = Sharded<double, MeshT, "I:x J:y">;
  using Rep = Sharded<double, MeshT, "I J">;
  using B = Sharded<double, MeshT, "J:y K">;
  using C = Sharded<double, MeshT, "I:x K">;
  const A a = gshard::from_global<A>(mesh, {9, 6}, values(54, 1));  // 9 rows: uneven blocks
  const B b = gshard::from_global<B>(mesh, {6, 5}, values(30, 2));
  gshard::comm_counters().reset();
  gshard::Trace t(mesh);
  t.begin_step();
  const int line_reshard = __LINE__ + 1;
  const Rep r = gshard::reshard<Rep>(a);
  const int line_einsum = __LINE__ + 1;
  const C c = gshard::einsum<"IJ,JK->IK">(a, b);
  t.end_step();
  const std::size_t recorded = t.events().size();
  const Rep untraced = gshard::reshard<Rep>(a);  // outside a step: not recorded
  CHECK(t.events().size() == recorded);

  // Every collective once, as counted (the untraced reshard counted too: subtract it).
  auto expect = counted();
  const auto after_untraced = expect;
  gshard::comm_counters().reset();
  const Rep again = gshard::reshard<Rep>(a);
  for (const auto& [key, c2] : counted()) {
    expect[key].first -= c2.first;
    expect[key].second -= c2.second;
    if (expect[key].first == 0) expect.erase(key);
  }
  INFO("traced: ", text(traced(t)), " counted: ", text(expect));
  CHECK(traced(t) == expect);
  CHECK(!after_untraced.empty() == (world_size() > 1));

  // Each collective on the user's line, with its op and layouts; the reshard's an AllGather.
  int collectives = 0;
  for (const auto& e : t.events()) {
    const std::string cat = e.category;
    CHECK(e.duration_us >= 0);
    CHECK(e.start_us >= 0);
    if (cat != "collective") continue;
    ++collectives;
    const std::string where = gshard::detail::trace_site(e.file, e.line);
    INFO(e.name, " over ", e.axes, " at ", where, " for ", e.op, ": ", e.detail);
    CHECK((where == site(line_reshard) || where == site(line_einsum)));
    CHECK(e.bytes >= 0);
    CHECK(!e.op.empty());
    if (where == site(line_reshard))
      CHECK(e.detail.find("reshard \"I:x J:y\" -> \"I J\"") != std::string::npos);
  }
  CHECK((collectives > 0) == (world_size() > 1));
  // The ops themselves, and the local GEMM of the einsum.
  bool reshard_op = false, contract = false;
  for (const auto& e : t.events()) {
    const std::string cat = e.category;
    if (cat == "op" && e.name == "reshard" &&
        gshard::detail::trace_site(e.file, e.line) == site(line_reshard))
      reshard_op = true;
    if (cat == "kernel" && e.name == "contract" &&
        gshard::detail::trace_site(e.file, e.line) == site(line_einsum))
      contract = e.detail.find("->") != std::string::npos;
  }
  CHECK(reshard_op);
  CHECK(contract);
  // The values are the program's (tracing changes nothing).
  CHECK(r.to_global() == a.to_global());
  CHECK(untraced.to_global() == again.to_global());
  const auto av = a.to_global(), bv = b.to_global(), cv = c.to_global();
  for (int i = 0; i < 9; ++i)
    for (int k = 0; k < 5; ++k) {
      double s = 0;
      for (int j = 0; j < 6; ++j) s += av[i * 6 + j] * bv[j * 5 + k];
      CHECK(cv[i * 5 + k] == doctest::Approx(s));
    }
}

}  // namespace

TEST_CASE("trace: every collective once, with the counters' bytes and the user's line") {
  gshard::test::TestMeshes meshes(world_size());
  for (const auto& mesh : meshes.m2) {
    INFO("mesh ", mesh.describe());
    check_traced_program(mesh);
  }
  for (const auto& mesh : meshes.m3) {
    INFO("mesh ", mesh.describe());
    check_traced_program(mesh);
  }
}

TEST_CASE("trace: the Chrome trace file holds every rank's events") {
  using M = gshard::Mesh<"x", "y">;
  const M mesh(MPI_COMM_WORLD, {world_size(), 1});
  using A = Sharded<float, M, "I:x J">;
  using Rep = Sharded<float, M, "I J">;
  std::vector<float> g(13 * 3);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i);
  const A a = gshard::from_global<A>(mesh, {13, 3}, g);
  long long id = world_rank() == 0 ? static_cast<long long>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const fs::path path = fs::temp_directory_path() / ("gshard_trace_" + std::to_string(id) + "_np" +
                                                     std::to_string(world_size()) + ".json");
  gshard::Trace t(mesh);
  for (int step = 0; step < 3; ++step) {
    t.begin_step();
    const Rep r = gshard::reshard<Rep>(a);
    const auto s = gshard::sum<"I">(r * r);
    (void)s;
    t.end_step();
  }
  t.write_chrome(path.string());
  // Each rank's count of events, to compare with the file's.
  long long mine = static_cast<long long>(t.events().size());
  std::vector<long long> counts(static_cast<std::size_t>(world_size()));
  MPI_Gather(&mine, 1, MPI_LONG_LONG, counts.data(), 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::ifstream in(path);
    const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    CHECK(j["otherData"]["ranks"] == world_size());
    CHECK(j["otherData"]["steps"] == 3);
    std::map<int, long long> per_rank;
    std::map<int, int> names;
    for (const auto& e : j["traceEvents"]) {
      const int pid = e["pid"].get<int>();
      if (e["ph"] == "M") {
        names[pid] += 1;
        continue;
      }
      CHECK(e["ph"] == "X");
      CHECK(e["ts"].get<double>() >= 0);
      CHECK(e["dur"].get<double>() >= 0);
      per_rank[pid] += 1;
      if (e["cat"] == "collective") {
        CHECK(e["args"]["bytes"].get<long long>() >= 0);
        CHECK(!e["args"]["axes"].get<std::string>().empty());
        CHECK(e["args"]["site"].get<std::string>().starts_with("timeline_test.cpp:"));
      }
    }
    for (int r = 0; r < world_size(); ++r) {
      CHECK(names[r] == 1);
      CHECK(per_rank[r] == counts[static_cast<std::size_t>(r)]);
    }
    fs::remove(path);
  }
  // A file that cannot be written fails on every rank.
  gshard::test::same_error_everywhere([&] { t.write_chrome("/nonexistent-dir/trace.json"); },
                                      "cannot write /nonexistent-dir");
}

TEST_CASE("trace: a step plan per step, the backward pass at the forward lines") {
  gshard::test::TestMeshes meshes(world_size());
  for (const auto& mesh : meshes.m2) {
    INFO("mesh ", mesh.describe());
    using M = std::decay_t<decltype(mesh)>;
    using X = Sharded<double, M, "B:x I">;
    using W = Sharded<double, M, "I:y H">;
    using R = Sharded<double, M, "B:x H">;
    const X x = gshard::from_global<X>(mesh, {7, 5}, values(35, 3));
    const R r = gshard::from_global<R>(mesh, {7, 3}, values(21, 5));
    W w = gshard::from_global<W>(mesh, {5, 3}, values(15, 4));
    int line_hidden = 0, line_loss = 0;
    gshard::comm_counters().reset();
    const gshard::StepPlan plan = gshard::explain_step(
        mesh,
        [&](int) {
          gshard::track(w);
          line_hidden = __LINE__ + 1;
          const auto h = gshard::tanh(gshard::einsum<"BI,IH->BH">(x, w));
          line_loss = __LINE__ + 1;
          const auto loss = gshard::einsum<"BH,BH->">(h, r).eval();
          const auto [g] = gshard::grad(loss, w);
          gshard::untrack(w);
          (void)g;
        },
        2);
    CHECK(plan.steps == 2);
    CHECK(plan.rank == mesh.rank());
    // Per step: half of what the counters saw in two steps.
    std::map<Key, std::pair<double, double>> expect;
    for (const auto& [key, c] : counted())
      expect[key] = {static_cast<double>(c.first) / 2.0, static_cast<double>(c.second) / 2.0};
    std::map<Key, std::pair<double, double>> got;
    for (const auto& row : plan.collectives) got[{row.kind, row.axes}] = {row.calls, row.bytes};
    INFO("plan: ", text(got), " counted: ", text(expect));
    CHECK(got == expect);
    // Self times add up to the time in top-level ops; the backward ops are at the forward line.
    double shares = 0;
    bool backward = false;
    for (const auto& o : plan.ops) {
      shares += o.share;
      CHECK(o.ms >= 0);
      if (o.op.starts_with("grad of ")) {
        CHECK((o.site == site(line_hidden) || o.site == site(line_loss)));
        backward = true;
      }
    }
    CHECK(shares == doctest::Approx(1.0).epsilon(1e-9));
    CHECK(backward);
    const nlohmann::json j = nlohmann::json::parse(plan.json());
    CHECK(j["steps"] == 2);
    CHECK(j["collectives"].size() == plan.collectives.size());
    CHECK(plan.text().find("step plan on rank") != std::string::npos);
  }
}

TEST_CASE("trace: one Trace at a time, the same error on every rank") {
  using M = gshard::Mesh<"x">;
  const M mesh(MPI_COMM_WORLD, {world_size()});
  gshard::Trace t(mesh);
  gshard::test::same_error_everywhere([&] { gshard::Trace second(mesh); },
                                      "another gshard::Trace is alive");
}
