// Cumulative sums (ops/scan.hpp), property-based: random tensors, layouts (the scanned label
// split over one or several axes in any order, replicated, partial copies), uneven sizes and
// element types through gshard::detail::cumsum_runtime, against a naive loop over the global
// values; each case also checks the exact communication (one ExScan of the shard totals, or the
// AllGather fallback when the label's axes are not in mesh order). Then typed cases, counter
// tests and errors.
//
// Shards are built by the test's own block arithmetic (tests/support); values are small
// integers or dyadic rationals, so every sum is exact and results are compared exactly.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/ops/scan.hpp>
// clang-format on

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::test::Dice;
using gshard::test::global_values;
using gshard::test::Grid;
using gshard::test::grid_of;
using gshard::test::Kind;
using gshard::test::kind_name;
using gshard::test::kind_shard;
using gshard::test::layout_text;
using gshard::test::list_text;
using gshard::test::mix;
using gshard::test::sizes_text;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

// The naive scan over global values (row-major in `labels` order).
std::vector<double> naive_scan(const std::vector<double>& g, const Shape& shape, int d,
                               bool exclusive) {
  Int inner = 1;
  for (std::size_t e = static_cast<std::size_t>(d) + 1; e < shape.size(); ++e) inner *= shape[e];
  const Int n = shape[static_cast<std::size_t>(d)];
  std::vector<double> out(g.size(), 0.0);
  for (std::size_t i = 0; i < g.size(); ++i) {
    const Int pos = (static_cast<Int>(i) / inner) % n;
    const Int start = static_cast<Int>(i) - pos * inner;
    double s = 0;
    for (Int j = 0; j < (exclusive ? pos : pos + 1); ++j)
      s += g[static_cast<std::size_t>(start + j * inner)];
    out[i] = s;
  }
  return out;
}

struct Case {
  std::vector<int> sizes;
  std::vector<std::string> names;
  std::string labels;
  char label = 0;
  Shape shape;
  Layout layout;
  Kind kind = Kind::f64;
  bool exclusive = false;
  std::uint64_t salt = 0;
};

Case random_case(Dice& dice, const std::vector<int>& sizes, const std::vector<std::string>& names,
                 std::uint64_t salt) {
  Case c;
  c.sizes = sizes;
  c.names = names;
  c.salt = salt;
  std::string pool = "ABCDSTUV";
  dice.shuffle(pool);
  c.labels = pool.substr(0, static_cast<std::size_t>(dice.between(1, 4)));
  c.label = c.labels[static_cast<std::size_t>(dice.below(static_cast<int>(c.labels.size())))];
  c.kind = static_cast<Kind>(dice.below(4));
  c.exclusive = dice.chance(50);
  for (std::size_t i = 0; i < c.labels.size(); ++i)
    c.shape.push_back(c.labels[i] == c.label
                          ? (dice.chance(30) ? dice.between(1, 3) : dice.between(1, 13))
                          : dice.between(1, 5));
  // Often the scanned label is split over a random non-empty set of axes, in random order.
  std::map<char, std::vector<int>> fixed;
  if (dice.chance(60)) {
    std::vector<int> axes;
    for (int a = 0; a < static_cast<int>(sizes.size()); ++a)
      if (dice.chance(55)) axes.push_back(a);
    if (axes.empty()) axes.push_back(dice.below(static_cast<int>(sizes.size())));
    dice.shuffle(axes);
    fixed[c.label] = axes;
  }
  c.layout = gshard::test::random_layout(dice, c.labels, static_cast<int>(sizes.size()), fixed);
  return c;
}

std::string describe(const Case& c, int index) {
  std::ostringstream s;
  s << "case #" << index << ": mesh " << sizes_text(c.sizes) << ", " << kind_name(c.kind) << ", "
    << (c.exclusive ? "exclusive_cumsum" : "cumsum") << " over '" << c.label << "', input \""
    << layout_text(c.layout, c.names) << "\" shape " << list_text(c.shape) << ", salt " << c.salt;
  return s.str();
}

// What the scan must send, by the test's own arithmetic: the label's axes of size > 1; one ExScan
// of the shard totals when they are in mesh order, else one AllGather of them.
struct Expected {
  Int calls = 0;
  std::string axes;
  gshard::Collective kind = gshard::Collective::exscan;
  Int bytes = 0;
};

Expected expected_comm(const Case& c, const Grid& grid, Int elem) {
  const int d = gshard::test::find_label(c.layout, c.label);
  std::vector<int> axes;
  bool ordered = true;
  for (int i = 0; i < c.layout.dims[d].axis_count; ++i) {
    const int a = c.layout.dims[d].axes[static_cast<std::size_t>(i)];
    if (c.sizes[static_cast<std::size_t>(a)] == 1) continue;
    if (!axes.empty() && a < axes.back()) ordered = false;
    axes.push_back(a);
  }
  Expected e;
  if (axes.empty()) return e;
  std::vector<int> sorted = axes;
  std::sort(sorted.begin(), sorted.end());
  int k = 1, me = 0;
  for (int a : sorted) {
    k *= c.sizes[static_cast<std::size_t>(a)];
    me = me * c.sizes[static_cast<std::size_t>(a)] + grid.coords[static_cast<std::size_t>(a)];
    e.axes.append(e.axes.empty() ? "" : "*").append(c.names[static_cast<std::size_t>(a)]);
  }
  Int lines = 1;  // padded local extents of the other dimensions
  for (int dd = 0; dd < c.layout.rank; ++dd) {
    if (dd == d) continue;
    Int shards = 1;
    for (int i = 0; i < c.layout.dims[dd].axis_count; ++i)
      shards *=
          c.sizes[static_cast<std::size_t>(c.layout.dims[dd].axes[static_cast<std::size_t>(i)])];
    lines *= (c.shape[static_cast<std::size_t>(dd)] + shards - 1) / shards;
  }
  e.calls = 1;
  if (ordered) {
    e.kind = gshard::Collective::exscan;
    e.bytes = me + 1 < k ? lines * elem : 0;
  } else {
    e.kind = gshard::Collective::all_gather;
    e.bytes = (k - 1) * lines * elem;
  }
  return e;
}

struct Tally {
  int cases = 0, failures = 0, exscans = 0, gathers = 0, partial = 0, empty_shards = 0,
      exclusive = 0;
};

template <class T>
std::string run_case(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid,
                     Tally& tally) {
  const std::vector<double> g = global_values(gshard::detail::product(c.shape), c.salt, c.kind);
  const gshard::detail::RuntimeTensor<T> x{
      c.layout, c.shape,
      gshard::test::device_copy(kind_shard<T>(c.layout, c.shape, g, grid, c.salt ^ 0xABCD, c.kind)),
      gshard::ReduceOp::sum};
  const Expected want = expected_comm(c, grid, Int{sizeof(T)});
  gshard::comm_counters().reset();
  gshard::detail::RuntimeTensor<T> r;
  std::string threw;
  try {
    r = gshard::detail::cumsum_runtime<T>(x, c.label, c.exclusive, mesh, c.names);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  if (want.calls) (want.kind == gshard::Collective::exscan ? tally.exscans : tally.gathers)++;
  tally.partial += c.layout.partial_count > 0 ? 1 : 0;
  tally.exclusive += c.exclusive ? 1 : 0;
  {
    const int d = gshard::test::find_label(c.layout, c.label);
    int k = 1;
    for (int i = 0; i < c.layout.dims[d].axis_count; ++i)
      k *= c.sizes[static_cast<std::size_t>(c.layout.dims[d].axes[static_cast<std::size_t>(i)])];
    tally.empty_shards += (c.shape[static_cast<std::size_t>(d)] + k - 1) / k * (k - 1) >=
                                  c.shape[static_cast<std::size_t>(d)]
                              ? (k > 1 ? 1 : 0)
                              : 0;
  }
  std::string wrong;
  const gshard::CommCount total = gshard::comm_counters().total();
  if (!(r.layout == c.layout))
    wrong = "result layout \"" + layout_text(r.layout, c.names) + "\"";
  else if (r.shape != c.shape)
    wrong = "result shape " + list_text(r.shape);
  else if (r.partial_op != gshard::ReduceOp::sum)
    wrong = "result partial op is not sum";
  else if (total.calls != want.calls)
    wrong =
        std::to_string(total.calls) + " collectives ran, expected " + std::to_string(want.calls);
  else if (want.calls == 1) {
    const gshard::CommCount got = gshard::comm_counters().get(want.axes, want.kind);
    if (got.calls != 1 || got.bytes != want.bytes)
      wrong = std::string("expected one ") + gshard::collective_name(want.kind) + " over " +
              want.axes + " of " + std::to_string(want.bytes) + " bytes, counted " +
              std::to_string(got.calls) + " calls, " + std::to_string(got.bytes) + " bytes";
  }
  // Values (on every rank, whatever was found above, so that all take part in the sum).
  std::vector<Int> global_of;
  std::vector<T> got;
  const std::string bad = gshard::test::sum_partial_copies(
      gshard::test::host_copy(r.data), c.layout, c.shape, grid, mesh, global_of, got);
  if (wrong.empty()) wrong = bad;
  const std::vector<double> ref =
      naive_scan(g, c.shape, gshard::test::find_label(c.layout, c.label), c.exclusive);
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const double want_v = ref[static_cast<std::size_t>(global_of[i])];
    if (static_cast<double>(got[i]) != want_v) {
      std::ostringstream s;
      s << "local element " << i << " (global " << global_of[i] << ") is "
        << static_cast<double>(got[i]) << ", expected " << want_v;
      wrong = s.str();
    }
  }
  return wrong;
}

constexpr int total_random_cases = 240;

}  // namespace

TEST_CASE("cumsum (run-time engine): random layouts, sizes, types and meshes vs a naive scan") {
  const int n = world_size();
  const gshard::test::TestMeshes meshes(n);
  const int per_mesh = (total_random_cases + static_cast<int>(meshes.all.size()) - 1) /
                       static_cast<int>(meshes.all.size());
  Dice dice(777001);
  Tally t;
  int reported = 0;
  for (const auto& [sizes, names, state] : meshes.all) {
    const Grid grid = grid_of(sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, sizes, names, static_cast<std::uint64_t>(t.cases) + 1);
      std::string wrong;
      switch (c.kind) {
        case Kind::f64:
          wrong = run_case<double>(c, *state, grid, t);
          break;
        case Kind::f32:
          wrong = run_case<float>(c, *state, grid, t);
          break;
        case Kind::i64:
          wrong = run_case<std::int64_t>(c, *state, grid, t);
          break;
        case Kind::i32:
          wrong = run_case<std::int32_t>(c, *state, grid, t);
          break;
      }
      if (!wrong.empty()) {
        ++t.failures;
        if (reported++ < 8)
          FAIL_CHECK(describe(c, t.cases)
                     << " at " << n << " ranks, rank " << world_rank() << ": " << wrong);
      }
      ++t.cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(t.cases << " random scans over " << meshes.all.size() << " meshes: " << t.exscans
                    << " with one ExScan, " << t.gathers << " with the AllGather fallback, "
                    << t.partial << " partial, " << t.empty_shards << " with empty shards, "
                    << t.exclusive << " exclusive");
  CHECK(t.cases >= 100);
  CHECK(t.failures == 0);
  if (n >= 2) CHECK(t.exscans > 0);
  if (n >= 4) CHECK(t.gathers > 0);  // a label over two axes of size > 1, in reverse order
  CHECK(t.partial > 0);
}

// --- typed API ----------------------------------------------------------------------------------

namespace {

using M = gshard::Mesh<"x", "y">;

// cumsum and exclusive_cumsum of a typed tensor: the result's spec is the input's, its values the
// naive scan's (to_global combines partial copies).
template <gshard::fixed_string Spec>
void typed_case(const M& mesh, const Shape& shape, int& cases) {
  using X = gshard::Sharded<double, M, Spec>;
  const std::vector<double> g = global_values(gshard::detail::product(shape),
                                              500 + static_cast<std::uint64_t>(cases), Kind::f64);
  const X x = gshard::from_global<X>(mesh, shape, g);
  const int d = X::layout.find('S');
  INFO("\"" << std::string(Spec.view()) << "\" shape " << list_text(shape) << " on mesh "
            << mesh.describe());
  const auto inc = gshard::cumsum<"S">(x);
  const auto exc = gshard::exclusive_cumsum<"S">(x);
  CHECK(std::string(decltype(inc)::spec.view()) == std::string(Spec.view()));
  CHECK(std::string(decltype(exc)::spec.view()) == std::string(Spec.view()));
  CHECK(inc.to_global() == naive_scan(g, shape, d, false));
  CHECK(exc.to_global() == naive_scan(g, shape, d, true));
  // A lazy input is evaluated first.
  std::vector<double> twice = naive_scan(g, shape, d, false);
  for (double& v : twice) v *= 2;
  CHECK(gshard::cumsum<"S">(x + x).to_global() == twice);
  ++cases;
}

}  // namespace

TEST_CASE("cumsum<\"S\">() / exclusive_cumsum<\"S\">(): typed cases on every 2-axis mesh") {
  const int n = world_size();
  int cases = 0;
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    typed_case<"B:x S:y">(mesh, {3, 11}, cases);
    typed_case<"S:y*x B">(mesh, {7, 2}, cases);  // axes not in mesh order: the fallback
    typed_case<"S:x*y">(mesh, {13}, cases);
    typed_case<"S B:y +x">(mesh, {5, 3}, cases);  // pending partial sum stays pending
    typed_case<"B S:x +y">(mesh, {2, 3}, cases);  // fewer elements than shards: empty shards
  }
  CHECK(cases >= 5);
}

TEST_CASE("cumsum over a split label: exactly one ExScan of the shard totals (or one AllGather)") {
  const int n = world_size();
  const int r = world_rank();
  auto check_one = [](const std::string& axes, gshard::Collective kind, Int bytes) {
    const gshard::CommCount total = gshard::comm_counters().total();
    const gshard::CommCount got = gshard::comm_counters().get(axes, kind);
    CHECK(total.calls == 1);
    CHECK(got.calls == 1);
    CHECK(got.bytes == bytes);
  };
  {
    const M mesh(MPI_COMM_WORLD, {1, n});
    using X = gshard::Sharded<double, M, "B S:y">;
    const Shape shape{3, 2 * n + 1};
    const std::vector<double> g = global_values(3 * (2 * n + 1), 91, Kind::f64);
    const X x = gshard::from_global<X>(mesh, shape, g);
    gshard::comm_counters().reset();
    const auto y = gshard::cumsum<"S">(x);
    if (n == 1) {
      CHECK(gshard::comm_counters().total().calls == 0);
    } else {
      // 3 shard totals (one per B row); every rank but the last passes them on.
      check_one("y", gshard::Collective::exscan, r + 1 < n ? 3 * 8 : 0);
    }
    CHECK(y.to_global() == naive_scan(g, shape, 1, false));
    // Over an unsplit label: no communication.
    using U = gshard::Sharded<double, M, "B:y S">;
    const U u = gshard::from_global<U>(mesh, shape, g);
    gshard::comm_counters().reset();
    const auto v = gshard::exclusive_cumsum<"S">(u);
    CHECK(gshard::comm_counters().total().calls == 0);
    CHECK(v.to_global() == naive_scan(g, shape, 1, true));
  }
  if (n >= 4) {
    const int a = 2, b = n / 2;
    const M mesh(MPI_COMM_WORLD, {a, b});
    const Shape shape{2 * n + 3, 3};
    const std::vector<double> g = global_values((2 * n + 3) * 3, 92, Kind::f64);
    {
      using X = gshard::Sharded<double, M, "S:x*y B">;  // mesh order: ExScan over x*y
      const X x = gshard::from_global<X>(mesh, shape, g);
      gshard::comm_counters().reset();
      const auto y = gshard::cumsum<"S">(x);
      check_one("x*y", gshard::Collective::exscan, r + 1 < n ? 3 * 8 : 0);
      CHECK(y.to_global() == naive_scan(g, shape, 0, false));
    }
    {
      using X = gshard::Sharded<double, M, "S:y*x B">;  // shard order is not group order
      const X x = gshard::from_global<X>(mesh, shape, g);
      gshard::comm_counters().reset();
      const auto y = gshard::cumsum<"S">(x);
      check_one("x*y", gshard::Collective::all_gather, (n - 1) * 3 * 8);
      CHECK(y.to_global() == naive_scan(g, shape, 0, false));
    }
    {
      using X = gshard::Sharded<double, M, "S:y B +x">;  // the partial sum stays pending
      const X x = gshard::from_global<X>(mesh, shape, g);
      gshard::comm_counters().reset();
      const auto y = gshard::exclusive_cumsum<"S">(x);
      check_one("y", gshard::Collective::exscan, (r % b) + 1 < b ? 3 * 8 : 0);
      CHECK(std::string(decltype(y)::spec.view()) == "S:y B +x");
      CHECK(y.to_global() == naive_scan(g, shape, 0, true));
    }
  }
}

TEST_CASE("cumsum errors: an unknown label and pending max partials throw on every rank") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  const std::vector<std::string> names{"x", "y"};
  using X = gshard::Sharded<double, M, "B S:y +x">;
  X x = gshard::full<X>(mesh, {2, 5}, 1.0);
  auto everywhere = [&](const std::string& message, const std::string& needle) {
    int threw = message.find(needle) != std::string::npos ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &threw, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    return threw == n;
  };
  std::string message;
  gshard::comm_counters().reset();
  try {
    (void)gshard::detail::cumsum_runtime(gshard::detail::runtime_tensor(x), 'Q', false,
                                         gshard::detail::mesh_state(mesh), names);
  } catch (const gshard::Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(everywhere(message,
                   "gshard::cumsum: label 'Q' is not in the input \"B S:y +x\" (global "
                   "shape [2, 5])"));
  gshard::detail::set_partial_op(x, gshard::ReduceOp::max);
  message.clear();
  try {
    (void)gshard::exclusive_cumsum<"S">(x);
  } catch (const gshard::Error& e) {
    message = e.what();
  }
  CHECK(everywhere(message,
                   "gshard::exclusive_cumsum: the input \"B S:y +x\" holds pending "
                   "max/min partials"));
  CHECK(gshard::comm_counters().total().calls == 0);  // both refuse before communicating
}
