// HDF5 datasets written and read collectively with parallel HDF5: round trips on every mesh and
// layout (every element type, uneven sizes, replicated and multi-axis layouts, resharding on
// load and onto another mesh), agreement with safetensors, and bad input (missing file or
// dataset, another rank, shape or element type, a dataset already there, not an HDF5 file), each
// the same gshard::Error on every rank with nothing written. Expected values are the formula of
// exact_values.hpp. hdf5_check.py writes and checks files with h5py and h5dump (CTest fixtures).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "errors.hpp"
#include "exact_values.hpp"
#include "mpi_test.hpp"
#include "op_checks.hpp"
#include "scratch_files.hpp"
// Included after mpi_test.hpp, as every op header.
#include <gshard/io/hdf5.hpp>
#include <gshard/io/safetensors.hpp>

namespace {

namespace fs = std::filesystem;
using gshard::Shape;
using gshard::Sharded;
using gshard::test::cleanup;
using gshard::test::exact_values;
using gshard::test::on_root;
using gshard::test::same_error_everywhere;
using gshard::test::scratch_dir;
using gshard::test::world_rank;
using gshard::test::world_size;
using M1 = gshard::Mesh<"e">;
using M2 = gshard::Mesh<"x", "y">;
namespace io = gshard::io;

const Shape shape_a{7, 5}, shape_b{3, 4, 6}, shape_c{11}, shape_d{5, 3};

// Four datasets (every element type; split, multi-axis and replicated layouts; a group path).
template <class M>
void save_four(const M& mesh, const std::string& path) {
  io::save_hdf5(
      path, "a",
      gshard::from_global<Sharded<float, M, "R:x C:y">>(mesh, shape_a, exact_values<float>(35, 1)));
  io::save_hdf5(path, "fields/b",
                gshard::from_global<Sharded<double, M, "P Q:x*y R">>(mesh, shape_b,
                                                                     exact_values<double>(72, 2)));
  io::save_hdf5(path, "/fields/ints/c",
                gshard::from_global<Sharded<std::int64_t, M, "N:y">>(
                    mesh, shape_c, exact_values<std::int64_t>(11, 3)));
  io::save_hdf5(path, "d",
                gshard::from_global<Sharded<std::int32_t, M, "R C">>(
                    mesh, shape_d, exact_values<std::int32_t>(15, 4)));
}

// Reads the four into other layouts on `mesh` and compares with the formula.
template <class M>
void check_four(const M& mesh, const std::string& path) {
  Sharded<float, M, "R C:x"> a(mesh, shape_a);
  io::load_hdf5_into(path, "a", a);
  CHECK(a.to_global() == exact_values<float>(35, 1));
  const auto b = io::load_hdf5<Sharded<double, M, "P:y Q R:x">>(mesh, path, "fields/b");
  CHECK(b.shape() == shape_b);
  CHECK(b.to_global() == exact_values<double>(72, 2));
  const auto c = io::load_hdf5<Sharded<std::int64_t, M, "N:x*y">>(mesh, path, "fields/ints/c");
  CHECK(c.to_global() == exact_values<std::int64_t>(11, 3));
  const auto d = io::load_hdf5<Sharded<std::int32_t, M, "R:y C:x">>(mesh, path, "/d");
  CHECK(d.to_global() == exact_values<std::int32_t>(15, 4));
}

std::string h5_dir() {
  const char* d = std::getenv("GSHARD_HDF5_DIR");
  REQUIRE_MESSAGE(d != nullptr, "set GSHARD_HDF5_DIR");
  return d;
}

TEST_CASE("hdf5: round trip on every mesh, resharding on load and onto another mesh") {
  const fs::path dir = scratch_dir("hdf5_roundtrip");
  gshard::test::TestMeshes meshes(world_size());
  for (const auto& mesh : meshes.m2) {
    INFO("mesh ", mesh.describe());
    const std::string path = (dir / (mesh.describe() + ".h5")).string();
    save_four(mesh, path);
    check_four(mesh, path);
    const M1 line(MPI_COMM_WORLD, {world_size()});
    const auto a = io::load_hdf5<Sharded<float, M1, "R C:e">>(line, path, "a");
    CHECK(a.to_global() == exact_values<float>(35, 1));
    const auto b = io::load_hdf5<Sharded<double, M1, "P:e Q R">>(line, path, "fields/b");
    CHECK(b.to_global() == exact_values<double>(72, 2));
  }
  for (const auto& mesh : meshes.m3) {
    INFO("mesh ", mesh.describe());
    const std::string path = (dir / "m3.h5").string();
    on_root([&] { fs::remove(path); });
    save_four(mesh, path);
    check_four(mesh, path);
  }
  // A scalar and an empty tensor.
  const M1 line(MPI_COMM_WORLD, {world_size()});
  const std::string path = (dir / "edge.h5").string();
  io::save_hdf5(path, "scalar",
                gshard::from_global<Sharded<double, M1, "">>(line, {}, std::vector<double>{2.5}));
  io::save_hdf5(path, "empty", Sharded<float, M1, "R:e C">(line, {0, 3}));
  CHECK(io::load_hdf5<Sharded<double, M1, "">>(line, path, "scalar").to_global() ==
        std::vector<double>{2.5});
  const auto empty = io::load_hdf5<Sharded<float, M1, "R C:e">>(line, path, "empty");
  CHECK(empty.shape() == Shape{0, 3});
  cleanup(dir);
}

TEST_CASE("hdf5: overwrite in place, and the same values as a safetensors checkpoint") {
  const fs::path dir = scratch_dir("hdf5_overwrite");
  const M2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  const std::string path = (dir / "f.h5").string();
  const auto v1 =
      gshard::from_global<Sharded<float, M2, "R:x C">>(mesh, shape_a, exact_values<float>(35, 1));
  const auto v2 =
      gshard::from_global<Sharded<float, M2, "R C:x">>(mesh, shape_a, exact_values<float>(35, 8));
  io::save_hdf5(path, "u", v1);
  io::save_hdf5(path, "u", v2, {.overwrite = true});
  const auto back = io::load_hdf5<Sharded<float, M2, "R:y C:x">>(mesh, path, "u");
  CHECK(back.to_global() == exact_values<float>(35, 8));
  // HDF5 to safetensors and back: the same bits.
  io::SafetensorsWriter w(mesh.comm());
  w.add("u", back);
  w.write((dir / "u.safetensors").string());
  io::SafetensorsReader r(mesh.comm(), (dir / "u.safetensors").string());
  const auto from_st = r.read<Sharded<float, M2, "R:x C">>(mesh, "u");
  io::save_hdf5(path, "u_again", from_st);
  CHECK(io::load_hdf5<Sharded<float, M2, "R C">>(mesh, path, "u_again").to_global() ==
        exact_values<float>(35, 8));
  cleanup(dir);
}

TEST_CASE("hdf5: bad input is the same error on every rank, and a failed save writes nothing") {
  const fs::path dir = scratch_dir("hdf5_bad");
  const M2 mesh(MPI_COMM_WORLD, {1, world_size()});
  const std::string path = (dir / "f.h5").string();
  save_four(mesh, path);
  const auto size = fs::file_size(path);
  const auto a =
      gshard::from_global<Sharded<float, M2, "R:y C">>(mesh, shape_a, exact_values<float>(35, 1));

  SUBCASE("a file that does not exist") {
    same_error_everywhere(
        [&] { (void)io::load_hdf5<Sharded<float, M2, "R C">>(mesh, path + ".missing", "a"); },
        "gshard::load_hdf5: no file " + path + ".missing");
  }
  SUBCASE("a file that is not HDF5") {
    const std::string text = (dir / "text.h5").string();
    on_root([&] { std::ofstream(text) << "not hdf5"; });
    same_error_everywhere([&] { (void)io::load_hdf5<Sharded<float, M2, "R C">>(mesh, text, "a"); },
                          "is not an HDF5 file");
    same_error_everywhere([&] { io::save_hdf5(text, "a", a); }, "exists and is not an HDF5 file");
    CHECK(fs::file_size(text) == 8);
  }
  SUBCASE("a dataset the file lacks: what the group holds") {
    same_error_everywhere(
        [&] { (void)io::load_hdf5<Sharded<float, M2, "R C">>(mesh, path, "fields/x"); },
        "has no \"/fields/x\" (\"/fields\" holds: b, ints)");
    same_error_everywhere([&] { (void)io::load_hdf5<Sharded<float, M2, "R C">>(mesh, path, "w"); },
                          "has no \"/w\" (\"/\" holds: a, d, fields)");
  }
  SUBCASE("a group where a dataset is wanted") {
    same_error_everywhere(
        [&] { (void)io::load_hdf5<Sharded<float, M2, "R C">>(mesh, path, "fields"); },
        "\"/fields\" is not a dataset");
  }
  SUBCASE("a bad dataset name") {
    same_error_everywhere([&] { io::save_hdf5(path, "a//b", a); }, "is not a dataset name");
  }
  SUBCASE("another element type") {
    same_error_everywhere(
        [&] { (void)io::load_hdf5<Sharded<std::int32_t, M2, "N">>(mesh, path, "fields/ints/c"); },
        "holds int64, the tensor is int32");
    same_error_everywhere([&] { (void)io::load_hdf5<Sharded<double, M2, "R C">>(mesh, path, "a"); },
                          "holds float32, the tensor is float64");
  }
  SUBCASE("another number of dimensions") {
    same_error_everywhere(
        [&] { (void)io::load_hdf5<Sharded<double, M2, "P Q">>(mesh, path, "fields/b"); },
        "has 3 dimensions [3, 4, 6], the layout \"P Q\" has 2");
  }
  SUBCASE("another shape") {
    Sharded<float, M2, "R:y C"> other(mesh, {7, 6});
    same_error_everywhere([&] { io::load_hdf5_into(path, "a", other); },
                          "has shape [7, 5], the tensor (\"R:y C\") has [7, 6]");
  }
  SUBCASE("a dataset already there, and an overwrite of another shape") {
    same_error_everywhere([&] { io::save_hdf5(path, "a", a); }, "exists (Hdf5SaveOptions");
    const auto wide =
        gshard::from_global<Sharded<float, M2, "R C:y">>(mesh, {7, 6}, exact_values<float>(42, 3));
    same_error_everywhere([&] { io::save_hdf5(path, "a", wide, {.overwrite = true}); },
                          "has shape [7, 5]");
    CHECK(fs::file_size(path) == size);
    check_four(mesh, path);
  }
  SUBCASE("a file in a directory that does not exist: no file appears") {
    const std::string nowhere = (dir / "no" / "such" / "f.h5").string();
    same_error_everywhere([&] { io::save_hdf5(nowhere, "a", a); }, "cannot create");
    CHECK_FALSE(fs::exists(dir / "no"));
  }
  cleanup(dir);
}

// The interop steps, run by CTest in order (tests/CMakeLists.txt): h5py writes reference.h5,
// gshard reads it and writes gshard_np<ranks>.h5 here (on 4 and on 8 ranks), h5py and h5dump
// check those.
TEST_CASE("hdf5 interop: read h5py's file, write one for h5py" * doctest::skip()) {
  const std::string dir = h5_dir();
  const int n = world_size();
  const M2 mesh(MPI_COMM_WORLD, {n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n});
  const std::string ref = dir + "/reference.h5";
  const auto f32 = io::load_hdf5<Sharded<float, M2, "R:x C:y">>(mesh, ref, "f32");
  CHECK(f32.shape() == Shape{5, 7});
  CHECK(f32.to_global() == exact_values<float>(35, 1));
  // Chunked and compressed, in a group.
  const auto f64 = io::load_hdf5<Sharded<double, M2, "P Q:y R:x">>(mesh, ref, "group/f64");
  CHECK(f64.shape() == Shape{3, 4, 6});
  CHECK(f64.to_global() == exact_values<double>(72, 2));
  // Big-endian on disk: HDF5 converts the byte order.
  const auto i64 = io::load_hdf5<Sharded<std::int64_t, M2, "N:x*y">>(mesh, ref, "i64_be");
  CHECK(i64.to_global() == exact_values<std::int64_t>(11, 3));
  const auto i32 = io::load_hdf5<Sharded<std::int32_t, M2, "R C:x">>(mesh, ref, "i32");
  CHECK(i32.to_global() == exact_values<std::int32_t>(15, 4));
  // h5py's int16 is not an int32 tensor.
  same_error_everywhere(
      [&] { (void)io::load_hdf5<Sharded<std::int32_t, M2, "R C">>(mesh, ref, "i16"); },
      "holds int16, the tensor is int32");
  // gshard writes the same values in its own layouts, and a safetensors file of one of them.
  const std::string out = dir + "/gshard_np" + std::to_string(n) + ".h5";
  io::save_hdf5(out, "f32", f32);
  io::save_hdf5(out, "group/f64", f64);
  io::save_hdf5(out, "i64", i64);
  io::save_hdf5(out, "i32", i32);
  io::SafetensorsWriter w(mesh.comm());
  w.add("f64", f64);
  w.write(dir + "/gshard_np" + std::to_string(n) + ".safetensors");
}

}  // namespace
