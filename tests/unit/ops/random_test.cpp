// Random ops (ops/random.hpp), property-based: random dropout, uniform_noise, random_uniform_like
// and random_normal_like cases through the run-time engines, with random layouts (split,
// replicated, several axes per label, pending sum or max/min partials), uneven sizes, float and
// double, on every listed mesh shape at this rank count, each checked against the naive formula
// computed here from our own copy of the counter-based generator (splitmix64 of seed and global
// index), and against zero communication. Then typed cases: the same result on every mesh as on a
// single rank, partial inputs keeping one mask on every copy, and errors.
#include <cmath>
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"
// The header under test, after mpi_test.hpp.
#include <gshard/ops/random.hpp>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::test::device_copy;
using gshard::test::Dice;
using gshard::test::for_block;
using gshard::test::Grid;
using gshard::test::grid_of;
using gshard::test::host_copy;
using gshard::test::layout_text;
using gshard::test::list_text;
using gshard::test::MeshUnderTest;
using gshard::test::mix;
using gshard::test::mpi_type_of;
using gshard::test::random_global;
using gshard::test::random_layout;
using gshard::test::shard_of;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

// Our own copy of the generator (tensor/random.hpp documents it): 53 bits of
// splitmix64(splitmix64(seed ^ stream * C) + g).
double unit(std::uint64_t seed, Int g, std::uint64_t stream) {
  const std::uint64_t bits =
      mix(mix(seed ^ (stream * 0xD1B54A32D192ED03ULL)) + static_cast<std::uint64_t>(g));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

template <class T>
T uniform_ref(std::uint64_t seed, Int g, T low, T high) {
  const T v =
      static_cast<T>(static_cast<double>(low) +
                     unit(seed, g, 0) * (static_cast<double>(high) - static_cast<double>(low)));
  return v < high ? v : low;
}

double normal_ref(std::uint64_t seed, Int g) {
  const double u1 = 1.0 - unit(seed, g, 0);
  const double u2 = unit(seed, g, 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

enum class Op { dropout, noise, uniform_like, normal_like };
const char* op_name(Op op) {
  switch (op) {
    case Op::dropout:
      return "dropout";
    case Op::noise:
      return "uniform_noise";
    case Op::uniform_like:
      return "random_uniform_like";
    case Op::normal_like:
      return "random_normal_like";
  }
  return "?";
}

struct Case {
  std::vector<int> sizes;
  std::vector<std::string> names;
  Op op = Op::dropout;
  bool single = false;
  gshard::ReduceOp partial_op = gshard::ReduceOp::sum;
  std::string labels;
  Shape shape;
  Layout layout;
  double rate = 0, a = 0, b = 1;  // dropout rate; noise/uniform range or normal mean, stddev
  std::uint64_t seed = 0, salt = 0;
};

std::string describe(const Case& c, int index) {
  std::ostringstream s;
  s << "case #" << index << ": mesh";
  for (int v : c.sizes) s << ' ' << v;
  s << ", " << op_name(c.op) << " in " << (c.single ? "float" : "double") << " of \""
    << layout_text(c.layout, c.names) << "\" shape " << list_text(c.shape) << " (partial op "
    << (c.partial_op == gshard::ReduceOp::sum ? "sum" : "max/min") << "), rate " << c.rate << ", a "
    << c.a << ", b " << c.b << ", seed " << c.seed;
  return s.str();
}

template <class T>
std::string run_case(const Case& c, const MeshUnderTest& m, const Grid& grid) {
  const Int total = gshard::detail::product(c.shape);
  const std::vector<double> global = random_global(total, c.salt, 0, c.single);
  // Max/min partials: every copy holds the whole value (a valid max/min partial).
  Layout shard_layout = c.layout;
  if (c.partial_op != gshard::ReduceOp::sum) shard_layout.partial_count = 0;
  const gshard::detail::RuntimeTensor<T> x{
      c.layout, c.shape,
      device_copy(shard_of<T>(shard_layout, c.shape, global, grid, c.salt, c.single)),
      c.partial_op};
  gshard::comm_counters().reset();
  gshard::detail::RuntimeTensor<T> r;
  std::string threw;
  try {
    switch (c.op) {
      case Op::dropout:
        r = gshard::detail::dropout_runtime<T>(*m.state, x, c.rate, c.seed);
        break;
      case Op::noise:
        r = gshard::detail::uniform_noise_runtime<T>(*m.state, x, static_cast<T>(c.a),
                                                     static_cast<T>(c.b), c.seed);
        break;
      case Op::uniform_like:
        r = gshard::detail::random_like_runtime<T>(*m.state, c.layout, c.shape,
                                                   gshard::detail::RandomKind::uniform, c.seed,
                                                   static_cast<T>(c.a), static_cast<T>(c.b));
        break;
      case Op::normal_like:
        r = gshard::detail::random_like_runtime<T>(*m.state, c.layout, c.shape,
                                                   gshard::detail::RandomKind::normal, c.seed,
                                                   static_cast<T>(c.a), static_cast<T>(c.b));
        break;
    }
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  std::string wrong;
  if (gshard::comm_counters().total().calls != 0)
    wrong = std::to_string(gshard::comm_counters().total().calls) + " collectives ran";
  const bool like = c.op == Op::uniform_like || c.op == Op::normal_like;
  Layout expect = c.layout;
  if (like) {
    expect.partial_count = 0;
    expect.partial = {};
  }
  if (wrong.empty() && !(r.layout == expect))
    wrong = "result layout \"" + layout_text(r.layout, c.names) + "\", expected \"" +
            layout_text(expect, c.names) + "\"";
  if (wrong.empty() && r.shape != c.shape) wrong = "result shape " + list_text(r.shape);
  if (wrong.empty() && !like && r.partial_op != c.partial_op) wrong = "partial op changed";
  // The reference, element by element in T, as the op documents it.
  const T scale = static_cast<T>(1.0 / (1.0 - c.rate));
  std::vector<double> ref(static_cast<std::size_t>(total));
  for (Int g = 0; g < total; ++g) {
    const T v = static_cast<T>(global[static_cast<std::size_t>(g)]);
    T out{};
    switch (c.op) {
      case Op::dropout:
        out = unit(c.seed, g, 0) >= c.rate ? static_cast<T>(v * scale) : T{};
        break;
      case Op::noise:
        out =
            static_cast<T>(v + uniform_ref<T>(c.seed, g, static_cast<T>(c.a), static_cast<T>(c.b)));
        break;
      case Op::uniform_like:
        out = uniform_ref<T>(c.seed, g, static_cast<T>(c.a), static_cast<T>(c.b));
        break;
      case Op::normal_like:
        out = static_cast<T>(static_cast<T>(c.a) + static_cast<T>(c.b) * normal_ref(c.seed, g));
        break;
    }
    ref[static_cast<std::size_t>(g)] = static_cast<double>(out);
  }
  int usable = r.layout.rank == c.layout.rank && r.shape == c.shape ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!usable) return wrong.empty() ? "unusable result" : wrong;
  std::vector<T> got = host_copy(r.data);
  std::vector<Int> global_of;
  for_block(r.layout, r.shape, grid, [&](Int, Int g) { global_of.push_back(g); });
  if (got.size() != global_of.size()) return "local size " + std::to_string(got.size());
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
    if (global_of[i] < 0 && got[i] != T{})
      wrong = "padding element " + std::to_string(i) + " holds " + std::to_string(got[i]);
  unsigned mask = 0;
  for (int i = 0; i < r.layout.partial_count; ++i)
    mask |= 1u << r.layout.partial[static_cast<std::size_t>(i)];
  bool exact = c.op != Op::normal_like;
  if (mask != 0 && c.partial_op == gshard::ReduceOp::sum) {
    exact = false;  // summands scaled (or one of them shifted) round differently
    MPI_Allreduce(MPI_IN_PLACE, got.data(), static_cast<int>(got.size()), mpi_type_of<T>(), MPI_SUM,
                  m.state->groups[mask]);
  } else if (mask != 0) {
    // Every copy held the same value, so every copy must hold the same result: one mask.
    std::vector<T> lo = got, hi = got;
    MPI_Allreduce(MPI_IN_PLACE, lo.data(), static_cast<int>(lo.size()), mpi_type_of<T>(), MPI_MIN,
                  m.state->groups[mask]);
    MPI_Allreduce(MPI_IN_PLACE, hi.data(), static_cast<int>(hi.size()), mpi_type_of<T>(), MPI_MAX,
                  m.state->groups[mask]);
    if (wrong.empty() && lo != hi) wrong = "the max/min partial copies differ";
  }
  const double tol = c.single ? 1e-5 : 1e-12;
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const auto g = static_cast<std::size_t>(global_of[i]);
    const double v = static_cast<double>(got[i]);
    const bool ok = exact ? v == ref[g] : std::abs(v - ref[g]) <= tol * (8 + std::abs(ref[g]));
    if (!ok) {
      std::ostringstream s;
      s.precision(17);
      s << "local element " << i << " (global " << g << ") is " << v << ", expected " << ref[g];
      wrong = s.str();
    }
  }
  return wrong;
}

Case random_case(Dice& dice, const MeshUnderTest& m, std::uint64_t salt) {
  Case c;
  c.sizes = m.sizes;
  c.names = m.names;
  c.salt = salt;
  c.seed = mix(salt * 977);
  c.op = static_cast<Op>(dice.below(4));
  if (dice.chance(30)) c.op = Op::dropout;
  c.single = dice.chance(30);
  std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  dice.shuffle(pool);
  c.labels = pool.substr(0, static_cast<std::size_t>(dice.between(1, 4)));
  for (std::size_t i = 0; i < c.labels.size(); ++i)
    c.shape.push_back(dice.chance(30) ? dice.between(1, 3) : dice.between(1, 9));
  c.layout = random_layout(dice, c.labels, static_cast<int>(m.sizes.size()), {});
  if (c.layout.partial_count > 0 && dice.chance(35))
    c.partial_op = dice.chance(50) ? gshard::ReduceOp::max : gshard::ReduceOp::min;
  const double rates[] = {0.0, 0.1, 0.5, 0.9, 0.999};
  c.rate = dice.chance(70) ? rates[dice.below(5)] : dice.below(1000) / 1000.0;
  if (c.op == Op::normal_like) {
    c.a = dice.between(-4, 4) / 2.0;
    c.b = dice.between(1, 6) / 2.0;
  } else {
    c.a = dice.between(-4, 1) / 2.0;
    c.b = c.a + dice.between(1, 6) / 2.0;
  }
  return c;
}

constexpr int total_cases = 400;

}  // namespace

TEST_CASE("random ops (run-time engines): random layouts, shapes, meshes vs the naive formula") {
  const gshard::test::TestMeshes test_meshes(world_size());
  const std::vector<MeshUnderTest>& meshes = test_meshes.all;
  const int per_mesh =
      (total_cases + static_cast<int>(meshes.size()) - 1) / static_cast<int>(meshes.size());
  Dice dice(777);
  int cases = 0, failures = 0, partial = 0, dropouts = 0;
  for (const auto& m : meshes) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, m, static_cast<std::uint64_t>(cases) + 1);
      partial += c.layout.partial_count > 0 ? 1 : 0;
      dropouts += c.op == Op::dropout ? 1 : 0;
      const std::string wrong =
          c.single ? run_case<float>(c, m, grid) : run_case<double>(c, m, grid);
      if (!wrong.empty() && failures++ < 8)
        FAIL_CHECK(describe(c, cases)
                   << " at " << world_size() << " ranks, rank " << world_rank() << ": " << wrong);
      ++cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(cases << " random-op cases over " << meshes.size() << " meshes: " << dropouts
                  << " dropouts, " << partial << " with partial inputs");
  CHECK(cases >= 100);
  CHECK(failures == 0);
}

// --- typed API ----------------------------------------------------------------------------------

namespace {

using M = gshard::Mesh<"x", "y">;

// The tensor's global values computed on a single rank (a 1x1 mesh over MPI_COMM_SELF).
template <gshard::fixed_string Spec, class F>
std::vector<double> single_rank(const Shape& shape, const std::vector<double>& global, F&& op) {
  const M self(MPI_COMM_SELF, {1, 1});
  const auto x = gshard::from_global<gshard::Sharded<double, M, Spec>>(self, shape, global);
  return op(x).to_global();
}

}  // namespace

TEST_CASE("dropout and noise, typed: the same values on every mesh as on a single rank") {
  const int n = world_size();
  const Shape shape{7, 5, 3};
  const std::vector<double> global = random_global(7 * 5 * 3, 41, 0, false);
  auto drop = [](const auto& x) { return gshard::dropout(x, 1234, 0.3); };
  auto noise = [](const auto& x) { return gshard::uniform_noise(x, 99, -0.5, 0.5); };
  const std::vector<double> want_drop = single_rank<"G S D">(shape, global, drop);
  const std::vector<double> want_noise = single_rank<"G S D">(shape, global, noise);
  // The single-rank result is the naive formula, and its mask is random_uniform's values.
  const M self(MPI_COMM_SELF, {1, 1});
  const auto u = gshard::random_uniform<gshard::Sharded<double, M, "G S D">>(self, shape, 1234);
  const std::vector<double> ug = u.to_global();
  int kept = 0;
  for (std::size_t g = 0; g < global.size(); ++g) {
    CHECK(want_drop[g] == (ug[g] >= 0.3 ? global[g] * (1.0 / 0.7) : 0.0));
    kept += ug[g] >= 0.3 ? 1 : 0;
  }
  CHECK(kept > 0);
  CHECK(kept < static_cast<int>(global.size()));
  int meshes = 0;
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    INFO("mesh " << ax << "x" << n / ax);
    ++meshes;
    const auto a =
        gshard::from_global<gshard::Sharded<double, M, "G:x S D:y">>(mesh, shape, global);
    const auto b =
        gshard::from_global<gshard::Sharded<double, M, "G S:y*x D">>(mesh, shape, global);
    gshard::comm_counters().reset();
    const auto da = gshard::dropout(a, 1234, 0.3);
    const auto db = gshard::dropout(b, 1234, 0.3);
    const auto na = gshard::uniform_noise(a, 99, -0.5, 0.5);
    CHECK(gshard::comm_counters().total().calls == 0);
    static_assert(std::is_same_v<decltype(da), const gshard::Sharded<double, M, "G:x S D:y">>);
    CHECK(da.to_global() == want_drop);
    CHECK(db.to_global() == want_drop);
    CHECK(na.to_global() == want_noise);
    // A lazy input: the expression is evaluated, then dropped out.
    CHECK(gshard::dropout(a + a, 1234, 0.3).to_global() ==
          single_rank<"G S D">(shape, global,
                               [&](const auto& x) { return gshard::dropout(x + x, 1234, 0.3); }));
    // random_*_like: the same values as random_uniform / random_normal of that layout.
    const auto ul = gshard::random_uniform_like(a, 5, -1.0, 2.0);
    CHECK(ul.to_global() ==
          gshard::random_uniform<gshard::Sharded<double, M, "G S D">>(self, shape, 5, -1.0, 2.0)
              .to_global());
    const auto nl = gshard::random_normal_like(b, 6, 1.0, 0.5);
    CHECK(nl.to_global() ==
          gshard::random_normal<gshard::Sharded<double, M, "G S D">>(self, shape, 6, 1.0, 0.5)
              .to_global());
  }
  CHECK(meshes >= 1);
}

TEST_CASE("dropout of a pending partial sum stays partial, every copy with the same mask") {
  const int n = world_size();
  const Shape shape{6, 5};
  const std::vector<double> global = random_global(30, 43, 0, false);
  const std::vector<double> want =
      single_rank<"I J">(shape, global, [](const auto& x) { return gshard::dropout(x, 7, 0.5); });
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    const Grid grid = grid_of({ax, n / ax}, world_rank());
    INFO("mesh " << ax << "x" << n / ax);
    using P = gshard::Sharded<double, M, "I:x J +y">;
    // Random summands over y (every copy non-zero), built with the tests' own block arithmetic.
    const P x(mesh, shape,
              device_copy(shard_of<double>(P::layout, shape, global, grid, 17, false)));
    gshard::comm_counters().reset();
    const auto d = gshard::dropout(x, 7, 0.5);
    static_assert(std::is_same_v<decltype(d), const P>);
    CHECK(gshard::comm_counters().total().calls == 0);
    const std::vector<double> got = d.to_global();  // sums the copies
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      CHECK(std::abs(got[i] - want[i]) <= 1e-12 * (4 + std::abs(want[i])));
    // Noise on a pending sum is added once.
    const auto nz = gshard::uniform_noise(x, 3, 0.0, 1.0);
    static_assert(std::is_same_v<decltype(nz), const P>);
    const std::vector<double> want_nz = single_rank<"I J">(
        shape, global, [](const auto& y) { return gshard::uniform_noise(y, 3, 0.0, 1.0); });
    const std::vector<double> got_nz = nz.to_global();
    for (std::size_t i = 0; i < got_nz.size(); ++i)
      CHECK(std::abs(got_nz[i] - want_nz[i]) <= 1e-12 * (4 + std::abs(want_nz[i])));
    // *_like of a partial type: a fresh, finished tensor.
    const auto u = gshard::random_uniform_like(x, 1);
    static_assert(std::is_same_v<decltype(u), const gshard::Sharded<double, M, "I:x J">>);
  }
}

TEST_CASE("random ops: bad rates and ranges throw gshard::Error on every rank") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  const auto x = gshard::full<gshard::Sharded<float, M, "I:y J">>(mesh, {5, 3}, 1.0f);
  for (double rate : {1.0, -0.25, 1.5}) {
    int threw = 0;
    std::string msg;
    try {
      (void)gshard::dropout(x, 1, rate);
    } catch (const gshard::Error& e) {
      threw = 1;
      msg = e.what();
    }
    CHECK(threw == 1);
    CHECK(msg.find("dropout") != std::string::npos);
    CHECK(msg.find("[0, 1)") != std::string::npos);
    int all = threw;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all == n);
  }
  int threw = 0;
  try {
    (void)gshard::uniform_noise(x, 1, 1.0f, 1.0f);
  } catch (const gshard::Error& e) {
    threw = std::string(e.what()).find("is empty") != std::string::npos ? 1 : 0;
  }
  CHECK(threw == 1);
  // Rate 0 keeps everything unchanged.
  CHECK(gshard::dropout(x, 5, 0.0).to_global() == x.to_global());
}
