// HaloField: every ghost cell after exchange() against the global field it stands for (a formula
// of the global index), on 1-, 2- and 3-D meshes, even and uneven grids, widths 1 and 2, with and
// without corners; Jacobi sweeps bitwise equal to a naive loop over the whole grid on one rank;
// the bytes exchanged; and bad widths, the same error on every rank.
#include <cstdint>
#include <string>
#include <vector>

#include "errors.hpp"
#include "mpi_test.hpp"
#include "op_checks.hpp"
// Included after mpi_test.hpp, as every op header.
#include <gshard/comm/counters.hpp>
#include <gshard/spmd/halo_field.hpp>

namespace {

using gshard::HaloField;
using gshard::HaloOptions;
using gshard::Shape;
using gshard::Sharded;
using gshard::test::same_error_everywhere;
using gshard::test::world_size;

constexpr double edge = -1.0;

double value_at(const std::vector<std::int64_t>& g) {
  double v = 0.25;
  for (std::size_t d = 0; d < g.size(); ++d)
    v += static_cast<double>(g[d]) * (d == 0 ? 1000.0 : d == 1 ? 1.0 : 0.001);
  return v;
}

// Every cell of this rank's view (ghosts included) against the global field: interior and face
// ghosts hold the field, corner ghosts too when asked for, cells past the global edge the edge.
template <class F>
int wrong_cells(const F& h, bool corners) {
  constexpr int rank = F::rank;
  const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), h.view());
  for (int d = 0; d < rank; ++d)
    if (h.extents()[static_cast<std::size_t>(d)] == 0) return 0;  // an empty block: no ghosts
  const std::int64_t w = h.width();
  std::vector<std::int64_t> ext(rank), idx(rank, 0);
  std::int64_t total = 1;
  for (int d = 0; d < rank; ++d) {
    ext[static_cast<std::size_t>(d)] = h.extents()[static_cast<std::size_t>(d)] + 2 * w;
    total *= ext[static_cast<std::size_t>(d)];
  }
  int wrong = 0;
  for (std::int64_t flat = 0; flat < total; ++flat) {
    std::int64_t rest = flat;
    for (int d = rank - 1; d >= 0; --d) {
      idx[static_cast<std::size_t>(d)] = rest % ext[static_cast<std::size_t>(d)];
      rest /= ext[static_cast<std::size_t>(d)];
    }
    std::vector<std::int64_t> g(rank);
    bool outside = false;
    int ghost_dims = 0;
    for (int d = 0; d < rank; ++d) {
      const auto u = static_cast<std::size_t>(d);
      g[u] = h.offsets()[u] + idx[u] - w;
      outside |= g[u] < 0 || g[u] >= h.shape()[u];
      ghost_dims += idx[u] < w || idx[u] >= w + h.extents()[u] ? 1 : 0;
    }
    const double want = outside || (ghost_dims >= 2 && !corners) ? edge : value_at(g);
    double got = 0;
    if constexpr (rank == 1) got = host(idx[0]);
    if constexpr (rank == 2) got = host(idx[0], idx[1]);
    if constexpr (rank == 3) got = host(idx[0], idx[1], idx[2]);
    if (got != want) ++wrong;
  }
  return wrong;
}

template <class S>
S field_tensor(const typename S::mesh_type& mesh, const Shape& shape) {
  std::vector<double> all(static_cast<std::size_t>(gshard::detail::product(shape)));
  std::vector<std::int64_t> g(shape.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    std::int64_t rest = static_cast<std::int64_t>(i);
    for (std::size_t d = shape.size(); d-- > 0;) {
      g[d] = rest % shape[d];
      rest /= shape[d];
    }
    all[i] = value_at(g);
  }
  return gshard::from_global<S>(mesh, shape, all);
}

template <class S>
void check_exchange(const typename S::mesh_type& mesh, const Shape& shape) {
  for (const std::int64_t w : {1, 2}) {
    for (const bool corners : {false, true}) {
      CAPTURE(w);
      CAPTURE(corners);
      CAPTURE(gshard::detail::shape_string(shape));
      // Too narrow blocks for the halo: the same error everywhere, nothing else to check.
      bool narrow = false;
      for (int d = 0; d < S::rank; ++d) {
        const int k = gshard::detail::shard_count(S::layout.dims[d], mesh.sizes());
        narrow |= k > 1 && gshard::detail::ceil_div(shape[static_cast<std::size_t>(d)], k) < w;
      }
      if (narrow) {
        same_error_everywhere([&] { HaloField<S> h(mesh, shape, {.width = w}, edge); },
                              "is narrower than the halo width");
        continue;
      }
      HaloField<S> h(mesh, shape, {.width = w, .corners = corners}, edge);
      h.assign(field_tensor<S>(mesh, shape));
      h.exchange();
      CHECK(wrong_cells(h, corners) == 0);
      // Twice: the ghosts are refreshed, not accumulated.
      h.exchange();
      CHECK(wrong_cells(h, corners) == 0);
      // And back out as a tensor.
      CHECK(h.tensor().to_global() == field_tensor<S>(mesh, shape).to_global());
    }
  }
}

TEST_CASE("HaloField: ghost cells hold the neighbours' values on every mesh and grid") {
  gshard::test::TestMeshes meshes(world_size());
  using M2 = gshard::Mesh<"x", "y">;
  for (const auto& mesh : meshes.m2) {
    INFO("mesh ", mesh.describe());
    for (const Shape& shape : {Shape{8, 6}, Shape{7, 5}, Shape{17, 3}, Shape{3, 11}}) {
      check_exchange<Sharded<double, M2, "I:x J:y">>(mesh, shape);
      check_exchange<Sharded<double, M2, "I:y J:x">>(mesh, shape);
      check_exchange<Sharded<double, M2, "I:x*y J">>(mesh, shape);
    }
    check_exchange<Sharded<double, M2, "I:x">>(mesh, Shape{13});
    check_exchange<Sharded<double, M2, "I:x J K:y">>(mesh, Shape{5, 3, 6});
  }
  for (const auto& mesh : meshes.m3) {
    INFO("mesh ", mesh.describe());
    using M3 = gshard::Mesh<"x", "y", "z">;
    check_exchange<Sharded<double, M3, "I:x J:y K:z">>(mesh, Shape{5, 6, 7});
  }
}

// The 5-point Jacobi sweep of examples/hpc/heat2d, written once for both sides.
KOKKOS_INLINE_FUNCTION double jacobi(double c, double n, double s, double w, double e, double r) {
  return c + r * (n + s + w + e - 4.0 * c);
}

TEST_CASE("HaloField: Jacobi sweeps equal a naive loop over the whole grid, bit for bit") {
  gshard::test::TestMeshes meshes(world_size());
  using M2 = gshard::Mesh<"x", "y">;
  using Grid = Sharded<double, M2, "I:x J:y">;
  const double r = 0.2;
  const int sweeps = 12;
  for (const auto& mesh : meshes.m2) {
    for (const Shape& shape : {Shape{9, 10}, Shape{16, 5}}) {
      INFO("mesh ", mesh.describe(), " shape ", gshard::detail::shape_string(shape));
      const std::int64_t ny = shape[0], nx = shape[1];
      HaloField<Grid> a(mesh, shape, {}, 1.5), b(mesh, shape, {}, 1.5);
      a.assign(field_tensor<Grid>(mesh, shape));
      gshard::CommCounters& counters = gshard::comm_counters();
      counters.reset();
      for (int s = 0; s < sweeps; ++s) {
        a.exchange();
        const auto in = a.view();
        const auto out = b.view();
        Kokkos::parallel_for(
            "jacobi",
            Kokkos::MDRangePolicy<Kokkos::Rank<2>>({1, 1},
                                                   {a.extents()[0] + 1, a.extents()[1] + 1}),
            KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
              out(i, j) =
                  jacobi(in(i, j), in(i - 1, j), in(i + 1, j), in(i, j - 1), in(i, j + 1), r);
            });
        std::swap(a, b);
      }
      // Bytes: each split dimension's faces, each way, from every rank with a neighbour there.
      std::int64_t want = 0;
      for (int d = 0; d < 2; ++d) {
        const int k = gshard::detail::shard_count(Grid::layout.dims[d], mesh.sizes());
        const int me =
            gshard::detail::shard_index(Grid::layout.dims[d], mesh.sizes(), mesh.coordinates());
        const auto u = static_cast<std::size_t>(d);
        const std::int64_t face = a.extents()[1 - u] * 8;
        if (a.extents()[u] == 0) continue;
        const bool next_has_rows = me + 1 < k && a.offsets()[u] + a.extents()[u] < shape[u];
        want += ((me > 0 ? 1 : 0) + (next_has_rows ? 1 : 0)) * face;
      }
      CHECK(counters.total().bytes == want * sweeps);
      // The naive loop on every rank over the whole grid, edge cells 1.5.
      std::vector<double> u = field_tensor<Grid>(mesh, shape).to_global(), v(u.size());
      auto at = [&](const std::vector<double>& f, std::int64_t i, std::int64_t j) {
        return i < 0 || j < 0 || i >= ny || j >= nx ? 1.5 : f[static_cast<std::size_t>(i * nx + j)];
      };
      for (int s = 0; s < sweeps; ++s) {
        for (std::int64_t i = 0; i < ny; ++i)
          for (std::int64_t j = 0; j < nx; ++j)
            v[static_cast<std::size_t>(i * nx + j)] = jacobi(
                at(u, i, j), at(u, i - 1, j), at(u, i + 1, j), at(u, i, j - 1), at(u, i, j + 1), r);
        std::swap(u, v);
      }
      CHECK(a.tensor().to_global() == u);
    }
  }
}

TEST_CASE("HaloField: bad geometry and a tensor of another shape, the same error everywhere") {
  using M1 = gshard::Mesh<"x">;
  using Line = Sharded<double, M1, "I:x">;
  const M1 mesh(MPI_COMM_WORLD, {world_size()});
  same_error_everywhere([&] { HaloField<Line> h(mesh, {10}, {.width = -1}); }, "is negative");
  same_error_everywhere([&] { HaloField<Line> h(mesh, {10, 2}); }, "has 1 dimensions");
  HaloField<Line> h(mesh, {10});
  const auto other = gshard::zeros<Line>(mesh, {12});
  same_error_everywhere([&] { h.assign(other); }, "is not of the field's global shape [10]");
}

}  // namespace
