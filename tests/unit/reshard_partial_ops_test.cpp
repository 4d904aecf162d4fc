// Finishing partial values with max and min (not only sums), and what explain() says about a
// plan, checked against values computed here from each rank's coordinates.
#include <algorithm>
#include <string>
#include <vector>

#include "mpi_test.hpp"

namespace gs = gshard;

namespace {

using Mesh = gs::Mesh<"x", "y">;

Mesh make_mesh() {
  const int size = gs::test::world_size();
  const int x = size >= 4 ? 2 : 1;
  return Mesh(MPI_COMM_WORLD, {x, size / x});
}

// The copy held at mesh coordinate y: a different value per (element, y).
double copy_value(std::int64_t g, int y) {
  return static_cast<double>((g * 7 + y * 13) % 17) - 8.0;
}

template <class Partial>
Partial partial_copies(const Mesh& mesh, const gs::Shape& shape, gs::ReduceOp op) {
  Partial p(mesh, shape);
  const auto offsets = p.global_offsets();
  const auto valid = p.valid_extents();
  const auto local = p.local_shape();
  auto host = Kokkos::create_mirror_view(p.local_view());
  for (std::int64_t i = 0; i < local[0]; ++i)
    for (std::int64_t j = 0; j < local[1]; ++j) {
      const bool real = i < valid[0] && j < valid[1];
      const std::int64_t g = (offsets[0] + i) * shape[1] + offsets[1] + j;
      host(i * local[1] + j) = real ? copy_value(g, mesh.coordinate(1)) : 0.0;
    }
  Kokkos::deep_copy(p.local_view(), host);
  gshard::detail::set_partial_op(p, op);
  return p;
}

std::vector<double> expected(const Mesh& mesh, const gs::Shape& shape, gs::ReduceOp op) {
  std::vector<double> out(static_cast<std::size_t>(shape[0] * shape[1]));
  for (std::int64_t g = 0; g < shape[0] * shape[1]; ++g) {
    double v = copy_value(g, 0);
    for (int y = 1; y < mesh.axis_size(1); ++y)
      v = op == gs::ReduceOp::max ? std::max(v, copy_value(g, y)) : std::min(v, copy_value(g, y));
    out[static_cast<std::size_t>(g)] = v;
  }
  return out;
}

}  // namespace

TEST_CASE("reshard: partial max and min finish to the elementwise max and min") {
  const Mesh mesh = make_mesh();
  const gs::Shape shape{5, 7};  // uneven over every axis size used
  for (gs::ReduceOp op : {gs::ReduceOp::max, gs::ReduceOp::min}) {
    using Partial = gs::Sharded<double, Mesh, "G:x S +y">;
    const auto p = partial_copies<Partial>(mesh, shape, op);
    const auto want = expected(mesh, shape, op);
    CHECK(p.to_global() == want);
    const auto replicated = gs::reshard<gs::Sharded<double, Mesh, "G S">>(p);  // AllReduce(max/min)
    CHECK(replicated.to_global() == want);
    const auto split =
        gs::reshard<gs::Sharded<double, Mesh, "G:x S:y">>(p);  // ReduceScatter or AllReduce
    CHECK(split.to_global() == want);
    const auto moved =
        gs::reshard<gs::Sharded<double, Mesh, "S:y G">>(p);  // other order, other split
    std::vector<double> transposed(want.size());
    const auto moved_global = moved.to_global();
    for (std::int64_t g = 0; g < 5; ++g)
      for (std::int64_t s = 0; s < 7; ++s)
        transposed[static_cast<std::size_t>(s * 5 + g)] = want[static_cast<std::size_t>(g * 7 + s)];
    CHECK(moved_global == transposed);
  }
}

TEST_CASE("explain: each step names its collective, axes, layouts and bytes") {
  const Mesh mesh = make_mesh();
  gs::comm_counters().reset();
  const auto a = gs::random_normal<gs::Sharded<float, Mesh, "G:y S">>(mesh, {8, 6}, 3);
  const auto plan = gs::plan_reshard<gs::Sharded<float, Mesh, "G S">>(a);
  const std::string text = gs::explain(plan);
  CHECK(text.find("reshard \"G:y S\" -> \"G S\", global shape [8, 6]") != std::string::npos);
  const auto y = mesh.axis_size(1);
  if (y > 1) {
    REQUIRE(plan.steps.size() == 1);
    CHECK(plan.steps[0].kind == gs::StepKind::all_gather);
    CHECK(text.find("AllGather over y: \"G:y S\" -> \"G S\"") != std::string::npos);
    // (y-1) blocks of ceil(8/y) x 6 floats.
    const std::int64_t bytes = (y - 1) * ((8 + y - 1) / y) * 6 * 4;
    CHECK(plan.bytes() == bytes);
    CHECK(text.find(std::to_string(bytes) + " bytes") != std::string::npos);
    // The counters agree with the plan.
    const auto r = gs::reshard<gs::Sharded<float, Mesh, "G S">>(a);
    CHECK(gs::comm_counters().get("y", gs::Collective::all_gather).bytes == bytes);
    CHECK(gs::comm_counters().get("y", gs::Collective::all_gather).calls == 1);
  } else {
    CHECK(plan.bytes() == 0);
  }
}
