// Environment brings up MPI and Kokkos; Error formats its message. Checked against MPI's own
// answers and a closed-form sum.
#include <cstdlib>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "mpi_test.hpp"
#include "user/gshard/nn/model.hpp"

TEST_CASE("Environment: MPI and Kokkos are up inside the test main") {
  int initialized = 0;
  MPI_Initialized(&initialized);
  CHECK(initialized == 1);
  CHECK(Kokkos::is_initialized());
  int level = -1;
  MPI_Query_thread(&level);
  CHECK(level >= MPI_THREAD_FUNNELED);
}

TEST_CASE("Environment: a nested Environment leaves the outer MPI and Kokkos alone") {
  {
    gshard::Environment inner;
    CHECK_FALSE(inner.owns_mpi());
    CHECK_FALSE(inner.owns_kokkos());
  }
  // Still usable after the inner one is gone: a Kokkos kernel and a collective.
  const int rank = gshard::test::world_rank();
  const int size = gshard::test::world_size();
  Kokkos::View<long*> values("values", 100);
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<>(0, 100),
      KOKKOS_LAMBDA(const int i) { values(i) = static_cast<long>(rank) * 100 + i; });
  long local = 0;
  Kokkos::parallel_reduce(
      "sum", Kokkos::RangePolicy<>(0, 100),
      KOKKOS_LAMBDA(const int i, long& acc) { acc += values(i); }, local);
  long total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  // Every rank contributed r*100 + i for i < 100: sum = 100 * 100 * size(size-1)/2 + size * 4950.
  const long n = size;
  CHECK(total == 100L * 100L * n * (n - 1) / 2 + n * 4950L);
}

TEST_CASE("Error: what() names the op and the detail") {
  const gshard::Error error("Mesh", "axis sizes 2x4 = 8 do not match the communicator size 4");
  CHECK(error.op() == "Mesh");
  CHECK(std::string(error.what()) ==
        "gshard::Mesh: axis sizes 2x4 = 8 do not match the communicator size 4");
  CHECK_THROWS_AS(throw error, gshard::Error);
}

TEST_CASE("Error: names the user's source line, never the library's") {
  std::string what;
  const int line = __LINE__ + 2;
  try {
    const gshard::Mesh<"x"> bad(MPI_COMM_WORLD, {gshard::test::world_size() + 1});
  } catch (const gshard::Error& e) {
    what = e.what();
  }
  INFO("message: " << what);
  CHECK(what.ends_with("(at environment_test.cpp:" + std::to_string(line) + ")"));
  // No site outside a call, and a library header's line never counts.
  CHECK(std::string(gshard::Error("op", "text").what()) == "gshard::op: text");
  // The library is the folder its headers were included from, compared exactly: the same path
  // spelled through "..", yes; another gshard/ folder (a user's gshard/nn/, another copy), no.
  const std::string root = gshard::detail::library_root();
  REQUIRE(root.ends_with("/include/gshard/"));
  CHECK(gshard::detail::library_file(root + "ops/einsum.hpp"));
  CHECK(gshard::detail::library_file(root + "tensor/../core/error.hpp"));
  CHECK(gshard::detail::library_file(root + "nn/./../ops/shape/../index.hpp"));
  CHECK_FALSE(gshard::detail::library_file(root + "../../examples/moe_lm/train.hpp"));
  CHECK_FALSE(gshard::detail::library_file("/home/u/gshard/nn/model.hpp"));
  CHECK_FALSE(gshard::detail::library_file("/nonexistent/include/gshard/ops/einsum.hpp"));
  CHECK_FALSE(gshard::detail::library_file("/home/u/src/model.cpp"));
  CHECK(gshard::detail::lexically_normal("/a/b/../c/./d") == "/a/c/d");
  CHECK(gshard::detail::lexically_normal("../a/../../b") == "../../b");
  CHECK(gshard::detail::lexically_normal("a/b/..") == "a/");
  // A user's file in a folder named gshard/nn/ is the user's: its line is the one errors name.
  {
    std::string nested;
    try {
      user_model::make_bad_mesh(gshard::test::world_size());
    } catch (const gshard::Error& e) {
      nested = e.what();
    }
    INFO("message: " << nested);
    CHECK(nested.ends_with("(at model.hpp:" + std::to_string(user_model::bad_mesh_line) + ")"));
  }
  // An error inside a nested public call names the outer (user's) line: an einsum whose labels
  // disagree is evaluated inside the Sharded conversion, both entry points.
  using M = gshard::Mesh<"x">;
  const M mesh(MPI_COMM_WORLD, {gshard::test::world_size()});
  const gshard::Sharded<float, M, "I J"> a(mesh, {3, 4});
  const gshard::Sharded<float, M, "J K"> b(mesh, {5, 2});
  what.clear();
  const int line2 = __LINE__ + 2;
  try {
    const gshard::Sharded<float, M, "I K"> c = gshard::einsum<"IJ,JK->IK">(a, b);
  } catch (const gshard::Error& e) {
    what = e.what();
  }
  INFO("message: " << what);
  CHECK(what.find("label 'J' has size") != std::string::npos);
  CHECK(what.ends_with("(at environment_test.cpp:" + std::to_string(line2) + ")"));
}

// Under AddressSanitizer its allocator replaces glibc's: nothing to tune.
#if defined(__GLIBC__) && !defined(__SANITIZE_ADDRESS__)
namespace {
/// Whether glibc serves a 64 MiB block with mmap (above its 32 MiB ceiling for the mmap
/// threshold): mallinfo2 counts such blocks in hblks.
bool large_block_mmapped() {
  const auto before = mallinfo2().hblks;
  void* block = std::malloc(std::size_t{64} << 20);
  REQUIRE(block != nullptr);
  const auto during = mallinfo2().hblks;
  std::free(block);
  return during == before + 1;
}
}  // namespace

TEST_CASE("Environment: malloc is left alone unless the application asks") {
  // The same order as the cases below run in: untuned first (tuning lasts for the process).
  const char* setting = std::getenv("GSHARD_MALLOC_TUNING");
  const bool forced_on = setting != nullptr && std::string(setting) == "1";
  const bool forced_off = setting != nullptr && std::string(setting) == "0";
  {
    gshard::Environment plain;
    CHECK(plain.malloc_tuned() == forced_on);
    CHECK(large_block_mmapped() == !forced_on);
  }
  gshard::Environment asked({.tune_malloc = true});
  CHECK(asked.malloc_tuned() == !forced_off);
  CHECK(large_block_mmapped() == forced_off);
}
#endif
