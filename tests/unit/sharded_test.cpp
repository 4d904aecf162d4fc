// Sharded: handle semantics, relabelling, shard geometry on uneven shapes, padding, creation and
// global I/O. Every expectation comes from our own block arithmetic over a global array held on
// every rank (block i of a dimension of size N over k shards is [i*c, min(N, (i+1)*c)), c =
// ceil(N/k), stored padded to c with zeros), never from the library's geometry code.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "errors.hpp"
#include "mpi_test.hpp"

namespace {

using gshard::Shape;
using gshard::test::world_rank;
using gshard::test::world_size;
using Mesh2 = gshard::Mesh<"x", "y">;

// --- our own geometry ---------------------------------------------------------------------------

// A layout written out by hand: per dimension (spec order) the mesh axes splitting it, major
// first; then the partial axes.
struct Geometry {
  std::vector<std::vector<int>> axes;
  std::vector<int> partial;
};

struct Grid {
  std::vector<int> sizes;
  std::vector<int> coords;  // of this rank, row-major, last axis fastest
};

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

Grid grid_of(const std::vector<int>& sizes, int rank) {
  Grid g{sizes, std::vector<int>(sizes.size())};
  for (std::size_t i = sizes.size(); i-- > 0;) {
    g.coords[i] = rank % sizes[i];
    rank /= sizes[i];
  }
  return g;
}

struct Block1 {
  std::int64_t offset, valid, chunk;
};

Block1 block1(std::int64_t n, const std::vector<int>& axes, const Grid& grid) {
  std::int64_t k = 1;
  std::int64_t index = 0;
  for (int a : axes) {
    const auto au = static_cast<std::size_t>(a);
    k *= grid.sizes[au];
    index = index * grid.sizes[au] + grid.coords[au];
  }
  const std::int64_t c = ceil_div(n, k);
  const std::int64_t offset = index * c;
  const std::int64_t valid = std::max<std::int64_t>(0, std::min(n, offset + c) - offset);
  return {offset, valid, c};
}

bool holds_values(const Geometry& geo, const Grid& grid) {
  for (int a : geo.partial)
    if (grid.coords[static_cast<std::size_t>(a)] != 0) return false;
  return true;
}

// The padded local block this rank should hold: global values at its block, zeros in the
// padding, zeros everywhere on copies at a nonzero coordinate of a partial axis.
template <class T>
std::vector<T> expected_local(const std::vector<T>& global, const Shape& shape, const Geometry& geo,
                              const Grid& grid, bool values = true) {
  const std::size_t r = shape.size();
  std::vector<Block1> b;
  std::int64_t total = 1;
  for (std::size_t d = 0; d < r; ++d) {
    b.push_back(block1(shape[d], geo.axes[d], grid));
    total *= b[d].chunk;
  }
  std::vector<T> out(static_cast<std::size_t>(total), T{});
  if (values && !holds_values(geo, grid)) return out;
  for (std::int64_t i = 0; i < total; ++i) {
    std::int64_t rest = i;
    std::int64_t g = 0;
    std::int64_t stride = 1;
    bool pad = false;
    for (std::size_t d = r; d-- > 0;) {
      const std::int64_t local = rest % b[d].chunk;
      rest /= b[d].chunk;
      if (local >= b[d].valid) pad = true;
      g += (b[d].offset + local) * stride;
      stride *= shape[d];
    }
    if (!pad) out[static_cast<std::size_t>(i)] = global[static_cast<std::size_t>(g)];
  }
  return out;
}

std::int64_t product(const Shape& s) {
  std::int64_t p = 1;
  for (auto n : s) p *= n;
  return p;
}

// 1 where the local element is padding, 0 where it is a real element.
std::vector<int> padding_mask(const Shape& shape, const Geometry& geo, const Grid& grid) {
  std::vector<std::int64_t> ones(static_cast<std::size_t>(product(shape)), 1);
  const Geometry no_partial{geo.axes, {}};
  const auto real = expected_local(ones, shape, no_partial, grid);
  std::vector<int> pad(real.size());
  for (std::size_t i = 0; i < real.size(); ++i) pad[i] = real[i] == 0 ? 1 : 0;
  return pad;
}

template <class V>
auto host_copy(const V& view) {
  using T = typename V::non_const_value_type;
  auto mirror = Kokkos::create_mirror_view(view);
  Kokkos::deep_copy(mirror, view);
  return std::vector<T>(mirror.data(), mirror.data() + mirror.extent(0));
}

// Distinct, exactly representable values (also in float): 1 + i mod 4001 (+ a sign pattern).
template <class T>
std::vector<T> make_global(const Shape& shape, int salt = 0) {
  std::vector<T> g(static_cast<std::size_t>(product(shape)));
  for (std::size_t i = 0; i < g.size(); ++i) {
    const auto v =
        static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(salt) * 13) % 4001) + 1;
    g[i] = static_cast<T>((i % 3 == 1) ? -v : v);
  }
  return g;
}

// What a tensor says about itself, collected by the only per-layout template code, so that the
// checks below are compiled once per element type.
template <class T>
struct Observed {
  Shape shape, local_shape, offsets, valid;
  std::int64_t size = 0;
  std::int64_t local_size = 0;
  std::vector<T> local;    // the padded local block
  std::vector<T> global;   // to_global()
  bool roots = false;      // gather_to_root results present
  std::vector<T> on_last;  // gather_to_root(size - 1)
  std::vector<T> on_zero;  // gather_to_root()
};

template <class S>
Observed<typename S::value_type> observe(const S& t, bool roots) {
  Observed<typename S::value_type> o;
  o.shape = t.shape();
  o.size = t.size();
  o.local_shape = t.local_shape();
  o.offsets = t.global_offsets();
  o.valid = t.valid_extents();
  o.local_size = t.local_size();
  o.local = host_copy(t.local_view());
  o.global = t.to_global();
  o.roots = roots;
  if (roots) {
    o.on_last = t.gather_to_root(t.mesh().size() - 1);
    o.on_zero = t.gather_to_root();
  }
  return o;
}

template <class T>
void check_observed(const Observed<T>& o, const std::string& what, const std::vector<T>& global,
                    const Shape& shape, const Geometry& geo, const Grid& grid) {
  INFO(what);
  CHECK(o.shape == shape);
  CHECK(o.size == product(shape));
  Shape local_shape;
  Shape offsets;
  Shape valid;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    const Block1 b = block1(shape[d], geo.axes[d], grid);
    local_shape.push_back(b.chunk);
    offsets.push_back(b.offset);
    valid.push_back(b.valid);
  }
  CHECK(o.local_shape == local_shape);
  CHECK(o.offsets == offsets);
  CHECK(o.valid == valid);
  CHECK(o.local_size == product(local_shape));
  CHECK(static_cast<std::int64_t>(o.local.size()) == product(local_shape));
  // The block itself, with zero padding (and zeros on partial copies other than the first).
  CHECK(o.local == expected_local(global, shape, geo, grid));
  CHECK(o.global == global);
  if (o.roots) {
    const int last = world_size() - 1;
    if (world_rank() == last) {
      CHECK(o.on_last == global);
    } else {
      CHECK(o.on_last.empty());
    }
    if (world_rank() == 0) {
      CHECK(o.on_zero == global);
    } else {
      CHECK(o.on_zero.empty());
    }
  }
}

// The tensor equals `reference` bit for bit, and the local block is the reference's block.
template <class T>
void check_bitwise(const std::string& what, const std::vector<T>& global,
                   const std::vector<T>& local, const std::vector<T>& reference, const Shape& shape,
                   const Geometry& geo, const Grid& grid) {
  INFO(what);
  REQUIRE(global.size() == reference.size());
  CHECK(std::memcmp(global.data(), reference.data(), reference.size() * sizeof(T)) == 0);
  const auto expect = expected_local(reference, shape, geo, grid);
  REQUIRE(local.size() == expect.size());
  CHECK(std::memcmp(local.data(), expect.data(), expect.size() * sizeof(T)) == 0);
}

std::vector<std::vector<int>> two_axis_meshes(int n) {
  std::vector<std::vector<int>> out;
  for (int a = 1; a <= n; ++a)
    if (n % a == 0) out.push_back({a, n / a});
  return out;
}

std::string describe_case(const std::vector<int>& sizes, std::string_view spec,
                          const Shape& shape) {
  std::string s = "mesh " + std::to_string(sizes[0]) + "x" + std::to_string(sizes[1]) + ", \"";
  s += spec;
  s += "\", shape " + gshard::detail::shape_string(shape);
  return s;
}

// Calls f.template operator()<Spec>(geometry) for each (spec, geometry) in the list below.
// Specs over Mesh<"x","y">: x = axis 0, y = axis 1.
template <class F>
void for_each_layout(F&& f) {
  f.template operator()<"G S M">(Geometry{{{}, {}, {}}, {}});
  f.template operator()<"G:x S M">(Geometry{{{0}, {}, {}}, {}});
  f.template operator()<"G S:y M">(Geometry{{{}, {1}, {}}, {}});
  f.template operator()<"G:x*y S M">(Geometry{{{0, 1}, {}, {}}, {}});
  f.template operator()<"G:y*x S M">(Geometry{{{1, 0}, {}, {}}, {}});
  f.template operator()<"G:y S:x M">(Geometry{{{1}, {0}, {}}, {}});
  f.template operator()<"G S M:x*y">(Geometry{{{}, {}, {0, 1}}, {}});
  f.template operator()<"G S M +x">(Geometry{{{}, {}, {}}, {0}});
  f.template operator()<"G:x S M +y">(Geometry{{{0}, {}, {}}, {1}});
  f.template operator()<"G S:y M +x">(Geometry{{{}, {1}, {}}, {0}});
  f.template operator()<"G S M +y +x">(Geometry{{{}, {}, {}}, {1, 0}});
}

// A shorter list for the cases that repeat over element types and generators.
template <class F>
void for_each_layout_short(F&& f) {
  f.template operator()<"G:y*x S M">(Geometry{{{1, 0}, {}, {}}, {}});
  f.template operator()<"G:y S:x M">(Geometry{{{1}, {0}, {}}, {}});
  f.template operator()<"G S M:x +y">(Geometry{{{}, {}, {0}}, {1}});
}

const std::vector<Shape> uneven_shapes = {
    {3, 5, 2}, {7, 1, 9}, {8, 4, 6}, {1, 1, 1}, {2, 9, 3}, {5, 3, 7}, {0, 3, 2},
};

}  // namespace

TEST_CASE("Sharded: geometry, padding, from_global/to_global/gather_to_root on uneven shapes") {
  const int n = world_size();
  int cases = 0;
  for (const auto& sizes : two_axis_meshes(n)) {
    const Mesh2 mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    const Grid grid = grid_of(sizes, world_rank());
    for_each_layout([&]<gshard::fixed_string Spec>(const Geometry& geo) {
      using S = gshard::Sharded<std::int64_t, Mesh2, Spec>;
      for (const Shape& shape : uneven_shapes) {
        ++cases;
        const auto global = make_global<std::int64_t>(shape, cases);
        const S t = gshard::from_global<S>(mesh, shape, global);
        check_observed(observe(t, true), describe_case(sizes, Spec.view(), shape), global, shape,
                       geo, grid);
        // zeros() holds zeros everywhere.
        const auto z = host_copy(gshard::zeros<S>(mesh, shape).local_view());
        CHECK(z == std::vector<std::int64_t>(static_cast<std::size_t>(t.local_size()), 0));
      }
    });
  }
  CHECK(cases == static_cast<int>(two_axis_meshes(n).size() * 11 * uneven_shapes.size()));
}

TEST_CASE("Sharded: to_global returns the from_global input for float, double, int32_t, int64_t") {
  const int n = world_size();
  auto check_type = [&]<class T>() {
    for (const auto& sizes : two_axis_meshes(n)) {
      const Mesh2 mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
      const Grid grid = grid_of(sizes, world_rank());
      auto run = [&]<gshard::fixed_string Spec>(const Geometry& geo) {
        using S = gshard::Sharded<T, Mesh2, Spec>;
        for (const Shape& shape : {Shape{5, 3, 7}, Shape{2, 9, 4}}) {
          const auto global = make_global<T>(shape, 5);
          const S t = gshard::from_global<S>(mesh, shape, global);
          check_observed(observe(t, false), describe_case(sizes, Spec.view(), shape), global, shape,
                         geo, grid);
        }
      };
      for_each_layout_short(run);
    }
  };
  check_type.template operator()<float>();
  check_type.template operator()<double>();
  check_type.template operator()<std::int32_t>();
  check_type.template operator()<std::int64_t>();
}

TEST_CASE("Sharded: copies share the shard, clone() does not") {
  const int n = world_size();
  const Mesh2 mesh(MPI_COMM_WORLD, {1, n});
  using S = gshard::Sharded<double, Mesh2, "G S:y">;
  const Shape shape{3, 2 * n + 1};
  const auto global = make_global<double>(shape);
  S a = gshard::from_global<S>(mesh, shape, global);
  S b = a;  // NOLINT: the copy is the point
  const S c = a.clone();
  CHECK(b.local_view().data() == a.local_view().data());
  CHECK(c.local_view().data() != a.local_view().data());
  CHECK(c.local_view().extent(0) == a.local_view().extent(0));
  CHECK(host_copy(c.local_view()) == host_copy(a.local_view()));
  // Writing through a is seen by b, not by c.
  auto view = a.local_view();
  Kokkos::parallel_for(
      "scale", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(view.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) { view(i) *= 2.0; });
  Kokkos::fence();
  std::vector<double> doubled(global);
  for (auto& v : doubled) v *= 2.0;
  CHECK(b.to_global() == doubled);
  CHECK(c.to_global() == global);
  // clone() keeps how pending partial sums combine.
  gshard::detail::set_partial_op(a, gshard::ReduceOp::max);
  CHECK(a.clone().partial_op() == gshard::ReduceOp::max);
  gshard::detail::set_partial_op(a, gshard::ReduceOp::sum);
  // Assigning a handle makes it share a's data too.
  S d = gshard::zeros<S>(mesh, shape);
  d = a;
  CHECK(d.local_view().data() == a.local_view().data());
}

// The types as<> gives, named at namespace scope: nvcc 13 cannot spell a spec the library computed
// inside a function body (docs/backends.md).
using AsABC = gshard::Sharded<std::int32_t, Mesh2, "A:x B C:y">;
using AsPQR = gshard::Sharded<std::int32_t, Mesh2, "P:x Q R:y">;
using AsUV = gshard::Sharded<double, Mesh2, "U V:x +y">;

TEST_CASE("Sharded: as<> relabels without a copy and keeps the values") {
  const int n = world_size();
  for (const auto& sizes : two_axis_meshes(n)) {
    const Mesh2 mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    using P = gshard::Sharded<std::int32_t, Mesh2, "G:x S M:y">;
    const Shape shape{5, 2, 3};
    const auto global = make_global<std::int32_t>(shape, 3);
    const P t = gshard::from_global<P>(mesh, shape, global);
    const auto r = t.as<"ABC">();
    static_assert(std::is_same_v<std::remove_const_t<decltype(r)>, AsABC>);
    CHECK(r.local_view().data() == t.local_view().data());
    CHECK(r.shape() == shape);
    CHECK(r.to_global() == global);
    const auto q = t.as<"P:x Q R:y">();
    static_assert(std::is_same_v<std::remove_const_t<decltype(q)>, AsPQR>);
    CHECK(q.local_view().data() == t.local_view().data());
    CHECK(q.to_global() == global);
    // Partial layouts keep their pending sums.
    using Q = gshard::Sharded<double, Mesh2, "G S:x +y">;
    const Q f = gshard::full<Q>(mesh, {4, 3}, 1.5);
    const auto g = f.as<"UV">();
    static_assert(std::is_same_v<std::remove_const_t<decltype(g)>, AsUV>);
    CHECK(g.local_view().data() == f.local_view().data());
    auto h = f.clone();
    gshard::detail::set_partial_op(h, gshard::ReduceOp::min);
    CHECK(h.as<"UV">().partial_op() == gshard::ReduceOp::min);
    CHECK(g.to_global() == std::vector<double>(12, 1.5));
  }
}

TEST_CASE("Sharded: wrapping a user's View") {
  const int n = world_size();
  for (const auto& sizes : two_axis_meshes(n)) {
    const Mesh2 mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    const Grid grid = grid_of(sizes, world_rank());
    using S = gshard::Sharded<float, Mesh2, "G:x S:y">;
    const Shape shape{7, 3};
    const Geometry geo{{{0}, {1}}, {}};
    const auto global = make_global<float>(shape, 9);
    const auto local = expected_local(global, shape, geo, grid);
    INFO(describe_case(sizes, S::spec_string(), shape));
    // The right size: zero-copy, and the values are the tensor's.
    Kokkos::View<float*> view("user", local.size());
    {
      auto h = Kokkos::create_mirror_view(view);
      for (std::size_t i = 0; i < local.size(); ++i) h(i) = local[i];
      Kokkos::deep_copy(view, h);
    }
    const S t(mesh, shape, view);
    CHECK(t.local_view().data() == view.data());
    CHECK(t.to_global() == global);
    // One element too many, one too few: gshard::Error naming both counts.
    for (const std::size_t wrong : {local.size() + 1, local.size() - 1}) {
      Kokkos::View<float*> bad("bad", wrong);
      std::string what;
      CHECK_THROWS_AS(S(mesh, shape, bad), gshard::Error);
      try {
        const S s(mesh, shape, bad);
      } catch (const gshard::Error& e) {
        what = e.what();
      }
      CHECK(what.find(std::to_string(wrong)) != std::string::npos);
      CHECK(what.find(std::to_string(local.size())) != std::string::npos);
    }
  }
}

TEST_CASE("Sharded: from_global with the wrong element count, and bad shapes, throw") {
  const int n = world_size();
  const Mesh2 mesh(MPI_COMM_WORLD, {n, 1});
  using S = gshard::Sharded<double, Mesh2, "G:x S">;
  const Shape shape{4, 5};
  for (const std::size_t count : {19u, 21u, 0u}) {
    const std::vector<double> global(count, 1.0);
    std::string what;
    try {
      (void)gshard::from_global<S>(mesh, shape, global);
    } catch (const gshard::Error& e) {
      what = e.what();
      CHECK(e.op() == "from_global");
    }
    INFO("message: " << what);
    CHECK(what.find("needs 20 values") != std::string::npos);
    CHECK(what.find("gave " + std::to_string(count)) != std::string::npos);
  }
  // Only the last rank passes a wrong count: every rank raises its error, none waits.
  const std::vector<double> mine(world_rank() == world_size() - 1 ? 19 : 20, 1.0);
  gshard::test::same_error_everywhere(
      [&] { (void)gshard::from_global<S>(mesh, shape, mine); },
      "needs 20 values, but rank " + std::to_string(world_size() - 1) + " gave 19");
  CHECK_THROWS_AS(S(mesh, Shape{4}), gshard::Error);
  CHECK_THROWS_AS(S(mesh, Shape{4, 5, 1}), gshard::Error);
  CHECK_THROWS_AS(S(mesh, Shape{4, -1}), gshard::Error);
  CHECK_NOTHROW(S(mesh, Shape{4, 5}));
}

TEST_CASE("Sharded: random tensors are the same global tensor on every mesh and layout") {
  const int n = world_size();
  const Shape shape{5, 7, 3};  // uneven over every split
  auto check_generator = [&]<class T, bool every_layout>(auto make, const char* what) {
    std::vector<T> reference;
    for (const auto& sizes : two_axis_meshes(n)) {
      const Mesh2 mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
      const Grid grid = grid_of(sizes, world_rank());
      // The replicated layout holds the whole tensor on every rank.
      using R = gshard::Sharded<T, Mesh2, "G S M">;
      const R rep = make.template operator()<R>(mesh);
      const auto rep_local = host_copy(rep.local_view());
      if (reference.empty()) {
        reference = rep_local;
        // Not a degenerate tensor: the values vary.
        CHECK(*std::min_element(reference.begin(), reference.end()) <
              *std::max_element(reference.begin(), reference.end()));
      }
      CHECK_MESSAGE(
          std::memcmp(rep_local.data(), reference.data(), reference.size() * sizeof(T)) == 0,
          what << " differs between meshes");
      auto check_layout = [&]<gshard::fixed_string Spec>(const Geometry& geo) {
        using S = gshard::Sharded<T, Mesh2, Spec>;
        const S t = make.template operator()<S>(mesh);
        check_bitwise(std::string(what) + ", " + describe_case(sizes, Spec.view(), shape),
                      t.to_global(), host_copy(t.local_view()), reference, shape, geo, grid);
      };
      if constexpr (every_layout) {
        for_each_layout(check_layout);
      } else {
        for_each_layout_short(check_layout);
      }
    }
  };
  check_generator.template operator()<double, true>(
      [&]<class S>(const Mesh2& m) { return gshard::random_normal<S>(m, shape, 42); }, "normal");
  check_generator.template operator()<float, false>(
      [&]<class S>(const Mesh2& m) { return gshard::random_normal<S>(m, shape, 7, 1.0f, 3.0f); },
      "normal float");
  check_generator.template operator()<double, false>(
      [&]<class S>(const Mesh2& m) { return gshard::random_uniform<S>(m, shape, 42, -2.0, 5.0); },
      "uniform");
  check_generator.template operator()<std::int64_t, false>(
      [&]<class S>(const Mesh2& m) {
        return gshard::random_uniform<S>(m, shape, 3, std::int64_t{-5}, std::int64_t{6});
      },
      "uniform int64");
  check_generator.template operator()<std::int32_t, false>(
      [&]<class S>(const Mesh2& m) { return gshard::random_uniform<S>(m, shape, 3, 10, 13); },
      "uniform int32");
}

TEST_CASE("Sharded: random tensors have plausible statistics (10k samples)") {
  const int n = world_size();
  const Mesh2 mesh(MPI_COMM_WORLD, {n, 1});
  const Shape shape{100, 100};
  const double count = 10000.0;
  auto moments = [&](const auto& v) {
    double sum = 0;
    double sq = 0;
    for (auto x : v) sum += static_cast<double>(x);
    const double mean = sum / count;
    for (auto x : v) sq += (static_cast<double>(x) - mean) * (static_cast<double>(x) - mean);
    return std::pair<double, double>{mean, std::sqrt(sq / (count - 1))};
  };
  {
    using S = gshard::Sharded<double, Mesh2, "G:x S">;
    const auto v = gshard::random_normal<S>(mesh, shape, 2024, 3.0, 2.0).to_global();
    const auto [mean, sd] = moments(v);
    // 5 standard errors: mean 2/100, stddev about 2/sqrt(2*10^4).
    CHECK(std::abs(mean - 3.0) < 0.1);
    CHECK(std::abs(sd - 2.0) < 0.075);
    // Another seed gives another tensor; the same seed the same one.
    const auto w = gshard::random_normal<S>(mesh, shape, 2025, 3.0, 2.0).to_global();
    CHECK(v != w);
    CHECK(gshard::random_normal<S>(mesh, shape, 2024, 3.0, 2.0).to_global() == v);
  }
  {
    using S = gshard::Sharded<float, Mesh2, "G S:x">;
    const auto v = gshard::random_uniform<S>(mesh, shape, 11, -1.0f, 3.0f).to_global();
    const auto [mean, sd] = moments(v);
    const double expected_sd = 4.0 / std::sqrt(12.0);
    CHECK(std::abs(mean - 1.0) < 5 * expected_sd / 100.0);
    CHECK(std::abs(sd - expected_sd) < 0.05);
    bool in_range = true;
    for (float x : v) in_range = in_range && x >= -1.0f && x < 3.0f;
    CHECK(in_range);
  }
  {
    using S = gshard::Sharded<std::int32_t, Mesh2, "G:x S">;
    const auto v = gshard::random_uniform<S>(mesh, shape, 5, -3, 7).to_global();
    std::vector<int> hits(10, 0);
    bool in_range = true;
    for (auto x : v) {
      if (x < -3 || x >= 7) {
        in_range = false;
        continue;
      }
      hits[static_cast<std::size_t>(x + 3)] += 1;
    }
    CHECK(in_range);
    // Each of 10 values about 1000 times (sd ~30).
    for (int h : hits) CHECK(std::abs(h - 1000) < 150);
  }
  CHECK_THROWS_AS(
      (gshard::random_uniform<gshard::Sharded<double, Mesh2, "G S">>(mesh, shape, 1, 2.0, 2.0)),
      gshard::Error);
}

TEST_CASE("Sharded: full() with partial axes sums to the value") {
  const int n = world_size();
  for (const auto& sizes : two_axis_meshes(n)) {
    const Mesh2 mesh(MPI_COMM_WORLD, {sizes[0], sizes[1]});
    const Grid grid = grid_of(sizes, world_rank());
    auto check = [&]<gshard::fixed_string Spec>(const Geometry& geo, unsigned partial_mask) {
      using S = gshard::Sharded<double, Mesh2, Spec>;
      const Shape shape{5, 3};
      INFO(describe_case(sizes, Spec.view(), shape));
      const double value = 2.5;
      const S t = gshard::full<S>(mesh, shape, value);
      CHECK(t.to_global() == std::vector<double>(15, value));
      // Summing the copies over the partial axes gives the value on real elements, 0 in padding.
      auto local = host_copy(t.local_view());
      MPI_Allreduce(MPI_IN_PLACE, local.data(), static_cast<int>(local.size()), MPI_DOUBLE, MPI_SUM,
                    mesh.group(partial_mask));
      const auto pad = padding_mask(shape, geo, grid);
      REQUIRE(pad.size() == local.size());
      bool ok = true;
      for (std::size_t i = 0; i < local.size(); ++i) ok = ok && local[i] == (pad[i] ? 0.0 : value);
      CHECK(ok);
      // And each copy holds either the value or 0: the sum is not spread out some other way.
      const auto mine = host_copy(t.local_view());
      for (std::size_t i = 0; i < mine.size(); ++i) ok = ok && (mine[i] == 0.0 || mine[i] == value);
      CHECK(ok);
    };
    check.template operator()<"G S:y +x">(Geometry{{{}, {1}}, {0}}, 1u);
    check.template operator()<"G:x S +y">(Geometry{{{0}, {}}, {1}}, 2u);
    check.template operator()<"G S +x +y">(Geometry{{{}, {}}, {0, 1}}, 3u);
    check.template operator()<"G S:x*y">(Geometry{{{}, {0, 1}}, {}}, 0u);
  }
}
