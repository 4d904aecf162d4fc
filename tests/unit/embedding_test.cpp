// gshard inside an application that owns MPI and Kokkos (docs/hpc.md): this file's main() is the
// application. It starts MPI and Kokkos itself, sets its own MPI error handler and signal
// handlers, and checks after gshard's work that none of that changed. gshard runs on a
// sub-communicator while the other ranks talk among themselves, and adopts the application's
// Views (LayoutRight, LayoutLeft, strided subviews) and stores results back into them. Values are
// checked against the closed-form fields the application wrote and a naive loop.
#include <mpi.h>

#include <array>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "mpi_test.hpp"
#include "test_runner.hpp"
// Included after mpi_test.hpp, as every op header.
#include <gshard/spmd/reshard.hpp>
#include <gshard/tensor/adopt.hpp>
#include <gshard/trace/timeline.hpp>

namespace {

using gshard::Shape;
using gshard::test::world_rank;
using gshard::test::world_size;

// The application's field: a value no two global indices share.
KOKKOS_INLINE_FUNCTION double field(std::int64_t i, std::int64_t j) {
  return 1000.0 * static_cast<double>(i) + static_cast<double>(j) + 0.25;
}

// --- the application's own process-wide state ------------------------------------------------

struct SignalState {
  void (*handler)(int) = nullptr;
  int flags = 0;
};

std::vector<SignalState> signal_handlers() {
  std::vector<SignalState> out;
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction now {};
    if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, nullptr, &now) != 0) {
      out.push_back({});
      continue;
    }
    out.push_back({now.sa_handler, now.sa_flags});
  }
  return out;
}

extern "C" void application_handler(int) {}

#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
// Whether glibc serves a 64 MiB block with mmap: what gshard's opt-in malloc tuning would change.
bool large_block_mmapped() {
  const auto before = mallinfo2().hblks;
  void* block = std::malloc(std::size_t{64} << 20);
  const auto during = mallinfo2().hblks;
  std::free(block);
  return block != nullptr && during > before;
}
#endif

struct ApplicationState {
  std::vector<SignalState> signals;
  int kokkos_concurrency = 0;
  bool large_blocks_mmapped = false;
};

ApplicationState application_state() {
  ApplicationState s;
  s.signals = signal_handlers();
  s.kokkos_concurrency = Kokkos::DefaultExecutionSpace().concurrency();
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
  s.large_blocks_mmapped = large_block_mmapped();
#endif
  return s;
}

bool world_errhandler_is_errors_return() {
  MPI_Errhandler h = MPI_ERRHANDLER_NULL;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &h);
  const bool same = h == MPI_ERRORS_RETURN;
  MPI_Errhandler_free(&h);
  return same;
}

// Mesh shapes for n ranks: 1-D and, where n factors, 2-D both ways.
std::vector<std::array<int, 2>> mesh_shapes(int n) {
  std::vector<std::array<int, 2>> shapes{{n, 1}, {1, n}};
  if (n % 2 == 0 && n > 2) shapes.push_back({2, n / 2});
  return shapes;
}

using Mesh2 = gshard::Mesh<"x", "y">;
using Grid = gshard::Sharded<double, Mesh2, "I:x J:y">;

template <class View>
void fill_block(const View& v, const gshard::LocalBlock& b) {
  const std::int64_t i0 = b.offsets[0];
  const std::int64_t j0 = b.offsets[1];
  Kokkos::parallel_for(
      "app fill", Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0}, {v.extent(0), v.extent(1)}),
      KOKKOS_LAMBDA(const int i, const int j) { v(i, j) = field(i0 + i, j0 + j); });
  Kokkos::fence();
}

// Every element of the global tensor is field(i, j) * scale.
void check_global(const Grid& t, double scale) {
  const std::vector<double> g = t.to_global();
  const std::int64_t n = t.shape()[1];
  int wrong = 0;
  for (std::int64_t i = 0; i < t.shape()[0]; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      if (g[static_cast<std::size_t>(i * n + j)] != field(i, j) * scale) ++wrong;
  CHECK(wrong == 0);
}

// How many elements of the application's View differ from field * scale over its block.
template <class View>
int wrong_in_block(const View& v, const gshard::LocalBlock& b, double scale) {
  auto host = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(host, v);
  int wrong = 0;
  for (std::size_t i = 0; i < v.extent(0); ++i)
    for (std::size_t j = 0; j < v.extent(1); ++j)
      if (host(i, j) != field(b.offsets[0] + static_cast<std::int64_t>(i),
                              b.offsets[1] + static_cast<std::int64_t>(j)) *
                            scale)
        ++wrong;
  return wrong;
}

}  // namespace

TEST_CASE("embedding: gshard on a sub-communicator while the other ranks work on their own") {
  const int rank = world_rank();
  const int size = world_size();
  // The lower half (rounded up) runs gshard; the upper half exchanges messages on its own.
  const int color = rank < (size + 1) / 2 ? 0 : 1;
  MPI_Comm half = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, color, rank, &half);
  int half_rank = 0;
  int half_size = 1;
  MPI_Comm_rank(half, &half_rank);
  MPI_Comm_size(half, &half_size);
  // Its errors return to the caller: gshard's messages must not depend on the handler.
  MPI_Comm_set_errhandler(half, MPI_ERRORS_RETURN);

  if (color == 0) {
    for (const auto& s : mesh_shapes(half_size)) {
      CAPTURE(s[0]);
      CAPTURE(s[1]);
      const Mesh2 mesh(half, {s[0], s[1]});
      // Uneven on purpose: 7 x 5 times 5 x 3.
      const Shape a_shape{7, 5};
      const Shape b_shape{5, 3};
      std::vector<double> a(35), b(15);
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5 * static_cast<double>(i) - 3.0;
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = 1.0 + 0.125 * static_cast<double>(i);
      const auto ta =
          gshard::from_global<gshard::Sharded<double, Mesh2, "I:x J:y">>(mesh, a_shape, a);
      const auto tb =
          gshard::from_global<gshard::Sharded<double, Mesh2, "J:y K">>(mesh, b_shape, b);
      const gshard::Sharded<double, Mesh2, "I:x K"> c = gshard::einsum<"IJ,JK->IK">(ta, tb);
      const std::vector<double> got = c.to_global();
      int wrong = 0;
      for (int i = 0; i < 7; ++i)
        for (int k = 0; k < 3; ++k) {
          double want = 0;
          for (int j = 0; j < 5; ++j)
            want += a[static_cast<std::size_t>(i * 5 + j)] * b[static_cast<std::size_t>(j * 3 + k)];
          if (got[static_cast<std::size_t>(i * 3 + k)] != doctest::Approx(want)) ++wrong;
        }
      CHECK(wrong == 0);
      // A bad View on the half's last rank only: the same Error on every rank of the half.
      const gshard::LocalBlock block = gshard::local_block<Grid>(mesh, a_shape);
      const bool bad = mesh.rank() == mesh.size() - 1;
      Kokkos::View<double**> v("v", static_cast<std::size_t>(block.extents[0]) + (bad ? 1 : 0),
                               static_cast<std::size_t>(block.extents[1]));
      std::string what;
      try {
        (void)gshard::adopt<Grid>(mesh, a_shape, v);
      } catch (const gshard::Error& e) {
        what = e.what();
      }
      CHECK(what.find("on rank " + std::to_string(mesh.size() - 1)) != std::string::npos);
      CHECK(what.find("(see gshard::local_block)") != std::string::npos);
    }
  } else {
    // The other half: a ring of point-to-point messages and a sum, on its own communicator.
    for (int round = 0; round < 20; ++round) {
      const int next = (half_rank + 1) % half_size;
      const int prev = (half_rank + half_size - 1) % half_size;
      int got = -1;
      MPI_Sendrecv(&half_rank, 1, MPI_INT, next, round, &got, 1, MPI_INT, prev, round, half,
                   MPI_STATUS_IGNORE);
      CHECK(got == prev);
      int sum = 0;
      MPI_Allreduce(&half_rank, &sum, 1, MPI_INT, MPI_SUM, half);
      CHECK(sum == half_size * (half_size - 1) / 2);
    }
  }
  MPI_Comm_free(&half);
  // Both halves go on together: a collective over the whole world.
  int total = 0;
  MPI_Allreduce(&rank, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(total == size * (size - 1) / 2);
}

TEST_CASE("embedding: a LayoutRight View that is the block is aliased, not copied") {
  for (const auto& s : mesh_shapes(world_size())) {
    CAPTURE(s[0]);
    CAPTURE(s[1]);
    const Mesh2 mesh(MPI_COMM_WORLD, {s[0], s[1]});
    const Shape shape{6 * s[0], 4 * s[1]};  // even: every block is full
    const gshard::LocalBlock block = gshard::local_block<Grid>(mesh, shape);
    Grid x(mesh, {1, 1});
    {
      // The application's View goes out of scope: the tensor keeps its memory alive.
      Kokkos::View<double**, Kokkos::LayoutRight> app("app", block.extents[0], block.extents[1]);
      fill_block(app, block);
      x = gshard::adopt<Grid>(mesh, shape, app, {.allow_copy = false});
      CHECK(gshard::aliases(x, app));
      // Shared memory: the application's later writes show in the tensor.
      Kokkos::parallel_for(
          "app scale", Kokkos::RangePolicy<>(0, static_cast<int>(app.extent(0))),
          KOKKOS_LAMBDA(const int i) {
            for (std::size_t j = 0; j < app.extent(1); ++j) app(i, j) *= 2.0;
          });
      Kokkos::fence();
      x.mark_modified();
    }
    check_global(x, 2.0);
    // A result goes back into an adopted View in place: reshard_into writes its shard.
    Kokkos::View<double**> out("out", block.extents[0], block.extents[1]);
    Grid y = gshard::adopt<Grid>(mesh, shape, out);
    REQUIRE(gshard::aliases(y, out));
    const Grid tripled = x * 1.5;
    gshard::reshard_into(tripled, y);
    CHECK(wrong_in_block(out, block, 3.0) == 0);
    gshard::store(y, out);  // already there: nothing to copy
    CHECK(wrong_in_block(out, block, 3.0) == 0);
    // From another layout: the reshard's collectives deliver into the application's memory.
    using Swapped = gshard::Sharded<double, Mesh2, "I:y J:x">;
    const Swapped swapped = gshard::reshard<Swapped>(x * 2.5);
    gshard::reshard_into(swapped, y);
    CHECK(gshard::aliases(y, out));
    CHECK(wrong_in_block(out, block, 5.0) == 0);
    // A result stored into a fresh View: one copy.
    Kokkos::View<double**> fresh("fresh", block.extents[0], block.extents[1]);
    const Grid half = x * 0.5;
    gshard::store(half, fresh);
    CHECK(wrong_in_block(fresh, block, 1.0) == 0);
  }
}

TEST_CASE("embedding: Views that cannot be the shard are copied once, visibly") {
  for (const auto& s : mesh_shapes(world_size())) {
    CAPTURE(s[0]);
    CAPTURE(s[1]);
    const Mesh2 mesh(MPI_COMM_WORLD, {s[0], s[1]});
    for (const Shape& shape : {Shape{6 * s[0], 4 * s[1]}, Shape{7, 5}, Shape{3, 11}}) {
      CAPTURE(shape[0]);
      CAPTURE(shape[1]);
      const gshard::LocalBlock block = gshard::local_block<Grid>(mesh, shape);
      const bool full = block.extents == block.padded;
      const auto m = static_cast<std::size_t>(block.extents[0]);
      const auto n = static_cast<std::size_t>(block.extents[1]);

      // LayoutLeft: column-major, not the spec's row-major order.
      Kokkos::View<double**, Kokkos::LayoutLeft> left("left", m, n);
      fill_block(left, block);
      {
        gshard::Trace trace(mesh);
        trace.start();
        const Grid x = gshard::adopt<Grid>(mesh, shape, left);
        trace.stop();
        // A 1-wide block is row-major in either order.
        const bool aliased = full && (m <= 1 || n <= 1);
        CHECK(gshard::aliases(x, left) == aliased);
        int copies = 0;
        for (const auto& e : trace.events())
          if (e.name == "adopt copy") ++copies;
        CHECK(copies == (aliased ? 0 : 1));
        check_global(x, 1.0);
        Kokkos::View<double**, Kokkos::LayoutLeft> back("back", m, n);
        const Grid times4 = x * 4.0;
        gshard::store(times4, back);
        CHECK(wrong_in_block(back, block, 4.0) == 0);
      }

      // A strided subview: the interior of an array with a one-cell halo, as a stencil keeps it.
      Kokkos::View<double**> with_halo("with_halo", m + 2, n + 2);
      Kokkos::deep_copy(with_halo, -7.0);
      const auto interior = Kokkos::subview(with_halo, std::make_pair(std::size_t{1}, m + 1),
                                            std::make_pair(std::size_t{1}, n + 1));
      fill_block(interior, block);
      const Grid x = gshard::adopt<Grid>(mesh, shape, interior);
      // Rows of the interior are n + 2 apart: row-major only when it is a single row.
      CHECK(gshard::aliases(x, interior) == (full && m <= 1));
      check_global(x, 1.0);
      const Grid times3 = x * 3.0;
      gshard::store(times3, interior);
      CHECK(wrong_in_block(interior, block, 3.0) == 0);
      // The halo is the application's: untouched.
      auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), with_halo);
      int halo_changed = 0;
      for (std::size_t i = 0; i < m + 2; ++i)
        for (std::size_t j = 0; j < n + 2; ++j)
          if ((i == 0 || j == 0 || i == m + 1 || j == n + 1) && host(i, j) != -7.0) ++halo_changed;
      CHECK(halo_changed == 0);

      // A copy can be refused: the same Error on every rank when any rank would copy.
      int would_copy = full ? 0 : 1;
      MPI_Allreduce(MPI_IN_PLACE, &would_copy, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      Kokkos::View<double**> right("right", m, n);
      fill_block(right, block);
      std::string what;
      try {
        const Grid y = gshard::adopt<Grid>(mesh, shape, right, {.allow_copy = false});
        CHECK(gshard::aliases(y, right));
        check_global(y, 1.0);
      } catch (const gshard::Error& e) {
        what = e.what();
      }
      if (would_copy != 0) {
        CHECK(what.find("allow_copy = false") != std::string::npos);
        CHECK(what.find("padded block") != std::string::npos);
        CHECK(what.find("embedding_test.cpp:") != std::string::npos);
      } else {
        CHECK(what.empty());
      }
    }
  }
}

TEST_CASE("embedding: a host View: aliased when the tensor lives on the host, else staged") {
  for (const auto& s : mesh_shapes(world_size())) {
    const Mesh2 mesh(MPI_COMM_WORLD, {s[0], s[1]});
    const Shape shape{5, 4 * s[1] + 1};
    const gshard::LocalBlock block = gshard::local_block<Grid>(mesh, shape);
    Kokkos::View<double**, Kokkos::HostSpace> host("host", block.extents[0], block.extents[1]);
    for (std::size_t i = 0; i < host.extent(0); ++i)
      for (std::size_t j = 0; j < host.extent(1); ++j)
        host(i, j) = field(block.offsets[0] + static_cast<std::int64_t>(i),
                           block.offsets[1] + static_cast<std::int64_t>(j));
    const Grid x = gshard::adopt<Grid>(mesh, shape, host);
    constexpr bool on_host = std::is_same_v<Grid::view_type::memory_space, Kokkos::HostSpace>;
    CHECK(gshard::aliases(x, host) == (on_host && block.extents == block.padded));
    check_global(x, 1.0);
    const Grid y = x * -2.0;
    Kokkos::View<double**, Kokkos::LayoutLeft, Kokkos::HostSpace> back("back", host.extent(0),
                                                                       host.extent(1));
    gshard::store(y, back);
    CHECK(wrong_in_block(back, block, -2.0) == 0);
  }
}

TEST_CASE("embedding: three dimensions, float, a replicated dimension, the instance fenced") {
  using Mesh1 = gshard::Mesh<"x">;
  using Cube = gshard::Sharded<float, Mesh1, "A B:x C">;
  const int n = world_size();
  const Mesh1 mesh(MPI_COMM_WORLD, {n});
  for (const Shape& shape : {Shape{3, 2 * n, 5}, Shape{2, 2 * n + 1, 3}}) {
    const gshard::LocalBlock block = gshard::local_block<Cube>(mesh, shape);
    CHECK(block.extents[0] == shape[0]);
    CHECK(block.extents[2] == shape[2]);
    Kokkos::View<float***> app("app", block.extents[0], block.extents[1], block.extents[2]);
    const std::int64_t b0 = block.offsets[1];
    const Kokkos::DefaultExecutionSpace instance;
    Kokkos::parallel_for(
        "app fill", Kokkos::RangePolicy<Kokkos::DefaultExecutionSpace>(instance, 0, 1),
        KOKKOS_LAMBDA(const int) {
          for (std::size_t a = 0; a < app.extent(0); ++a)
            for (std::size_t b = 0; b < app.extent(1); ++b)
              for (std::size_t c = 0; c < app.extent(2); ++c)
                app(a, b, c) =
                    static_cast<float>(100 * a + 10 * (b0 + static_cast<std::int64_t>(b)) + c);
        });
    // The application's instance is fenced before gshard reads the View.
    const Cube x = gshard::adopt<Cube>(instance, mesh, shape, app);
    CHECK(gshard::aliases(x, app) == (block.extents == block.padded));
    const std::vector<float> g = x.to_global();
    int wrong = 0;
    for (std::int64_t a = 0; a < shape[0]; ++a)
      for (std::int64_t b = 0; b < shape[1]; ++b)
        for (std::int64_t c = 0; c < shape[2]; ++c)
          if (g[static_cast<std::size_t>((a * shape[1] + b) * shape[2] + c)] !=
              static_cast<float>(100 * a + 10 * b + c))
            ++wrong;
    CHECK(wrong == 0);
  }
}

TEST_CASE("embedding: a store with the wrong extents is the same Error on every rank") {
  const Mesh2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  const Shape shape{5, 3};
  const Grid x = gshard::from_global<Grid>(mesh, shape, std::vector<double>(15, 1.0));
  const gshard::LocalBlock block = gshard::local_block<Grid>(mesh, shape);
  const bool bad = mesh.rank() == 0;
  Kokkos::View<double**> v("v", static_cast<std::size_t>(block.extents[0]),
                           static_cast<std::size_t>(block.extents[1]) + (bad ? 2 : 0));
  std::string what;
  const int line = __LINE__ + 2;
  try {
    gshard::store(x, v);
  } catch (const gshard::Error& e) {
    what = e.what();
  }
  INFO(what);
  CHECK(what.starts_with("gshard::store: on rank 0 of Mesh<x="));
  CHECK(what.find("LayoutRight View of extents") != std::string::npos);
  CHECK(what.ends_with("(at embedding_test.cpp:" + std::to_string(line) + ")"));
}

TEST_CASE("embedding: the application's MPI, Kokkos, malloc and signal settings are unchanged") {
  // Taken here, not in main(): doctest installs its own handlers around each test case.
  const ApplicationState before = application_state();
  {
    // gshard's own RAII scope inside the application: it owns nothing, so it finalises nothing.
    gshard::Environment env;
    CHECK_FALSE(env.owns_mpi());
    CHECK_FALSE(env.owns_kokkos());
    CHECK_FALSE(env.malloc_tuned());
    // gshard's work in between: a mesh, an einsum, an adopted View stored back, an agreed error.
    const Mesh2 mesh(MPI_COMM_WORLD, {1, world_size()});
    const Shape shape{4, 3 * world_size() + 1};
    const gshard::LocalBlock block = gshard::local_block<Grid>(mesh, shape);
    Kokkos::View<double**> app("app", block.extents[0], block.extents[1]);
    fill_block(app, block);
    const Grid x = gshard::adopt<Grid>(mesh, shape, app);
    const gshard::Sharded<double, Mesh2, "I"> rows = gshard::einsum<"IJ->I">(x);
    CHECK(rows.to_global().size() == 4);
    const Grid doubled = x * 2.0;
    gshard::store(doubled, app);
    CHECK(wrong_in_block(app, block, 2.0) == 0);
    CHECK_THROWS_AS((void)gshard::adopt<Grid>(mesh, Shape{5, 5}, app), gshard::Error);
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK(finalized == 0);
  CHECK(Kokkos::is_initialized());
  CHECK(world_errhandler_is_errors_return());
  const ApplicationState now = application_state();
  CHECK(now.kokkos_concurrency == before.kokkos_concurrency);
  CHECK(now.large_blocks_mmapped == before.large_blocks_mmapped);
  REQUIRE(now.signals.size() == before.signals.size());
  int changed = 0;
  for (std::size_t i = 0; i < now.signals.size(); ++i)
    if (now.signals[i].handler != before.signals[i].handler ||
        now.signals[i].flags != before.signals[i].flags)
      ++changed;
  CHECK(changed == 0);
  struct sigaction usr1 {};
  sigaction(SIGUSR1, nullptr, &usr1);
  const bool still_application_handler = usr1.sa_handler == &application_handler;
  CHECK(still_application_handler);
}

// The application: MPI and Kokkos are its own, and so are its error and signal handlers.
int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  Kokkos::initialize(argc, argv);
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  struct sigaction usr1 {};
  usr1.sa_handler = &application_handler;
  sigemptyset(&usr1.sa_mask);
  sigaction(SIGUSR1, &usr1, nullptr);
  const int failed = gshard::test::run_doctest(argc, argv);
  Kokkos::finalize();
  MPI_Finalize();
  return failed;
}
