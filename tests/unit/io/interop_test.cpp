// Tensor files across languages, driven by CTest (tests/CMakeLists.txt) in three steps: this
// program writes a checkpoint and a .npy on a 2x2 mesh ("write for numpy"); interop_check.py
// reads them with numpy alone (its own header parsing) and compares with the same formula, then
// writes files of its own; this program reads those on an 8x1 mesh ("read from numpy"). The
// directory comes in GSHARD_IO_DIR. Skipped unless named.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "exact_values.hpp"
#include "mpi_test.hpp"
// Included after mpi_test.hpp, as every op header.
#include <gshard/io/npy.hpp>
#include <gshard/io/safetensors.hpp>

namespace {

using gshard::Sharded;
using gshard::test::exact_values;
using M2 = gshard::Mesh<"x", "y">;

std::string io_dir() {
  const char* d = std::getenv("GSHARD_IO_DIR");
  REQUIRE_MESSAGE(d != nullptr, "set GSHARD_IO_DIR");
  return d;
}

TEST_CASE("io interop: write for numpy" * doctest::skip()) {
  REQUIRE(gshard::test::world_size() == 4);
  const M2 mesh(MPI_COMM_WORLD, {2, 2});
  const std::string dir = io_dir();
  if (gshard::test::world_rank() == 0) std::filesystem::create_directories(dir);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto a =
      gshard::from_global<Sharded<float, M2, "R:x C:y">>(mesh, {7, 5}, exact_values<float>(35, 1));
  const auto b = gshard::from_global<Sharded<double, M2, "P Q:x*y R">>(mesh, {3, 5, 6},
                                                                       exact_values<double>(90, 2));
  const auto c = gshard::from_global<Sharded<std::int64_t, M2, "N:y">>(
      mesh, {11}, exact_values<std::int64_t>(11, 3));
  const auto d = gshard::from_global<Sharded<std::int32_t, M2, "R C">>(
      mesh, {5, 3}, exact_values<std::int32_t>(15, 4));
  gshard::io::SafetensorsWriter w(mesh.comm());
  w.add("a", a);
  w.add("b", b);
  w.add("c", c);
  w.add("d", d);
  w.set_metadata("step", "42");
  w.write(dir + "/gshard.safetensors");
  gshard::io::save_npy(dir + "/gshard_a.npy", a);
}

TEST_CASE("io interop: read from numpy" * doctest::skip()) {
  REQUIRE(gshard::test::world_size() == 8);
  const M2 mesh(MPI_COMM_WORLD, {8, 1});
  const std::string dir = io_dir();
  gshard::io::SafetensorsReader r(mesh.comm(), dir + "/python.safetensors");
  CHECK(r.metadata("written_by") == "numpy");
  const auto e = r.read<Sharded<float, M2, "R:x C">>(mesh, "e");
  CHECK(e.to_global() == exact_values<float>(36, 5));
  const auto f = r.read<Sharded<std::int64_t, M2, "N:x">>(mesh, "f");
  CHECK(f.to_global() == exact_values<std::int64_t>(6, 6));
  const auto g = r.read<Sharded<double, M2, "P:x Q:y R">>(mesh, "g");
  CHECK(g.to_global() == exact_values<double>(60, 7));
  const auto npy = gshard::io::load_npy<Sharded<float, M2, "R C:x">>(mesh, dir + "/python_e.npy");
  CHECK(npy.to_global() == exact_values<float>(36, 5));
}

}  // namespace
