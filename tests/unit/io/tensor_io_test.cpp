// Tensor files (safetensors checkpoints and .npy) written and read collectively: round trips on
// every mesh and layout, resharding on load (other layouts, another mesh, another expert degree),
// checksums, atomic saves, and bad files (corrupt, truncated, other shapes and dtypes), each
// raising the same gshard::Error on every rank. Expected values are a formula of the global index
// (exact in every element type), never the library's own output.
#include <sys/resource.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <gshard/io/npy.hpp>
#include <gshard/io/safetensors.hpp>

#include "errors.hpp"
#include "exact_values.hpp"
#include "mpi_test.hpp"
#include "op_checks.hpp"
#include "scratch_files.hpp"

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
using M2 = gshard::Mesh<"x", "y">;
using M3 = gshard::Mesh<"x", "y", "z">;
using M1 = gshard::Mesh<"e">;

const Shape shape_a{7, 5}, shape_b{3, 4, 6}, shape_c{11}, shape_d{5, 3};

// Writes four tensors (every element type, uneven sizes, split, multi-axis and replicated
// layouts) from `mesh`, with metadata.
template <class M>
void write_four(const M& mesh, const std::string& path) {
  const auto a =
      gshard::from_global<Sharded<float, M, "R:x C:y">>(mesh, shape_a, exact_values<float>(35, 1));
  const auto b = gshard::from_global<Sharded<double, M, "P Q:x*y R">>(mesh, shape_b,
                                                                      exact_values<double>(72, 2));
  const auto c = gshard::from_global<Sharded<std::int64_t, M, "N:y">>(
      mesh, shape_c, exact_values<std::int64_t>(11, 3));
  const auto d = gshard::from_global<Sharded<std::int32_t, M, "R C">>(
      mesh, shape_d, exact_values<std::int32_t>(15, 4));
  gshard::io::SafetensorsWriter w(mesh.comm());
  w.add("a", a);
  w.add("b", b);
  w.add("c", c);
  w.add("d", d);
  w.set_metadata("step", "42");
  w.write(path);
}

// Reads the four back into other layouts on `mesh` and compares with the formula.
template <class M>
void check_four(const M& mesh, const std::string& path) {
  gshard::io::SafetensorsReader r(mesh.comm(), path);
  CHECK(r.metadata("step") == "42");
  CHECK(r.shape("b") == shape_b);
  Sharded<float, M, "R C:x"> a(mesh, shape_a);
  r.read_into("a", a);
  CHECK(a.to_global() == exact_values<float>(35, 1));
  const auto b = r.read<Sharded<double, M, "P:y Q R:x">>(mesh, "b");
  CHECK(b.to_global() == exact_values<double>(72, 2));
  const auto c = r.read<Sharded<std::int64_t, M, "N:x*y">>(mesh, "c");
  CHECK(c.to_global() == exact_values<std::int64_t>(11, 3));
  const auto d = r.read<Sharded<std::int32_t, M, "R:y C:x">>(mesh, "d");
  CHECK(d.to_global() == exact_values<std::int32_t>(15, 4));
}

TEST_CASE("safetensors: round trip on every mesh, resharding on load") {
  const fs::path dir = scratch_dir("roundtrip");
  gshard::test::TestMeshes meshes(world_size());
  for (const auto& mesh : meshes.m2) {
    INFO("mesh ", mesh.describe());
    const std::string path = (dir / "ck.safetensors").string();
    write_four(mesh, path);
    check_four(mesh, path);
    // Another mesh over the same ranks: one axis of all of them (another expert degree).
    const M1 line(MPI_COMM_WORLD, {world_size()});
    gshard::io::SafetensorsReader r(line.comm(), path);
    const auto a = r.read<Sharded<float, M1, "R C:e">>(line, "a");
    CHECK(a.to_global() == exact_values<float>(35, 1));
    const auto b = r.read<Sharded<double, M1, "P:e Q R">>(line, "b");
    CHECK(b.to_global() == exact_values<double>(72, 2));
    // The previous save is replaced atomically: no temporary is left.
    CHECK_FALSE(fs::exists(path + ".tmp"));
  }
  for (const auto& mesh : meshes.m3) {
    INFO("mesh ", mesh.describe());
    const std::string path = (dir / "ck3.safetensors").string();
    write_four(mesh, path);
    check_four(mesh, path);
  }
  cleanup(dir);
}

TEST_CASE("safetensors: the file is standard (header, order, checksums) and tensors tile it") {
  const fs::path dir = scratch_dir("layout");
  const M2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  const std::string path = (dir / "ck.safetensors").string();
  write_four(mesh, path);
  gshard::io::SafetensorsReader r(mesh.comm(), path);
  // Every byte accounted for: 8 + header + data.
  const auto& h = r.header();
  REQUIRE(h.tensors.size() == 4);
  std::uint64_t data = 0;
  for (const auto& t : h.tensors) data += t.end - t.begin;
  CHECK(8 + h.json_bytes + data == fs::file_size(path));
  CHECK(h.json_bytes % 8 == 0);
  CHECK(r.header().find("c")->dtype.name == "I64");
  for (const char* name : {"a", "b", "c", "d"})
    CHECK(h.metadata.count(std::string("gshard.checksum.") + name) == 1);
  // The raw bytes of "d" (replicated, written by one rank) are the int32 values in order.
  std::vector<std::int32_t> raw(15);
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(h.data_start() + h.find("d")->begin));
  in.read(reinterpret_cast<char*>(raw.data()), 60);
  CHECK(raw == exact_values<std::int32_t>(15, 4));
  cleanup(dir);
}

TEST_CASE("safetensors: bad files and mismatched tensors raise the same error on every rank") {
  const fs::path dir = scratch_dir("bad");
  const M2 mesh(MPI_COMM_WORLD, {1, world_size()});
  const std::string path = (dir / "ck.safetensors").string();
  write_four(mesh, path);
  const auto size = fs::file_size(path);
  Sharded<float, M2, "R:y C"> a(mesh, shape_a);

  SUBCASE("a tensor of another shape") {
    gshard::io::SafetensorsReader r(mesh.comm(), path);
    Sharded<float, M2, "R:y C"> other(mesh, {7, 6});
    same_error_everywhere([&] { r.read_into("a", other); }, "has shape [7, 5]");
  }
  SUBCASE("a tensor of another dtype") {
    gshard::io::SafetensorsReader r(mesh.comm(), path);
    Sharded<std::int32_t, M2, "N:y"> c(mesh, shape_c);
    same_error_everywhere([&] { r.read_into("c", c); }, "\"c\" is I64");
  }
  SUBCASE("a tensor the file lacks") {
    gshard::io::SafetensorsReader r(mesh.comm(), path);
    same_error_everywhere([&] { r.read_into("w", a); }, "no tensor \"w\" (it holds: a, b, c, d)");
  }
  SUBCASE("a layout of another rank") {
    gshard::io::SafetensorsReader r(mesh.comm(), path);
    same_error_everywhere([&] { (void)r.read<Sharded<double, M2, "P Q">>(mesh, "b"); },
                          "has 3 dimensions");
  }
  SUBCASE("a flipped byte in the data: the checksum") {
    on_root([&] {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(size - 3));
      f.put('\x7f');
    });
    gshard::io::SafetensorsReader r(mesh.comm(), path);
    r.read_into("a", a);  // not the corrupt tensor: fine
    CHECK(a.to_global() == exact_values<float>(35, 1));
    // The last tensor in the file is the last added, "d" (replicated).
    Sharded<std::int32_t, M2, "R C:y"> d(mesh, shape_d);
    same_error_everywhere([&] { r.read_into("d", d); }, "(the file is corrupt)");
  }
  SUBCASE("a truncated file") {
    on_root([&] { fs::resize_file(path, size - 5); });
    same_error_everywhere([&] { gshard::io::SafetensorsReader r(mesh.comm(), path); },
                          "(truncated file?)");
  }
  SUBCASE("a file shorter than its header") {
    on_root([&] { fs::resize_file(path, 20); });
    same_error_everywhere([&] { gshard::io::SafetensorsReader r(mesh.comm(), path); },
                          "truncated or not a safetensors file");
  }
  SUBCASE("random bytes") {
    on_root([&] {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      std::uint64_t x = 88172645463325252ULL;
      for (int i = 0; i < 4096; ++i) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        f.put(static_cast<char>(x));
      }
    });
    same_error_everywhere([&] { gshard::io::SafetensorsReader r(mesh.comm(), path); },
                          "gshard::read_safetensors: ");
  }
  SUBCASE("a header that is not JSON") {
    on_root([&] {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      const std::string json = "{\"a\": {\"dtype\": \"F32\", ";
      const std::uint64_t n = json.size();
      f.write(reinterpret_cast<const char*>(&n), 8);
      f << json;
    });
    same_error_everywhere([&] { gshard::io::SafetensorsReader r(mesh.comm(), path); },
                          "the header is not valid JSON");
  }
  SUBCASE("a file that does not exist") {
    same_error_everywhere([&] { gshard::io::SafetensorsReader r(mesh.comm(), path + ".missing"); },
                          "cannot open");
  }
  cleanup(dir);
}

TEST_CASE("safetensors: a failed save leaves the previous checkpoint whole") {
  const fs::path dir = scratch_dir("atomic");
  const M2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  const std::string path = (dir / "ck.safetensors").string();
  write_four(mesh, path);
  const auto before = fs::file_size(path);
  // A crash during an earlier save left a temporary: the next save replaces it.
  on_root([&] { std::ofstream(path + ".tmp") << "half a checkpoint"; });
  check_four(mesh, path);
  write_four(mesh, path);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  // A save that cannot create its temporary (a directory is in the way) fails on every rank
  // and leaves the file as it was.
  on_root([&] { fs::create_directories(path + ".tmp/blocker"); });
  const auto v =
      gshard::from_global<Sharded<float, M2, "R:x C">>(mesh, shape_a, exact_values<float>(35, 9));
  gshard::io::SafetensorsWriter w(mesh.comm());
  w.add("a", v);
  same_error_everywhere([&] { w.write(path); }, "gshard::write_safetensors: ");
  CHECK(fs::file_size(path) == before);
  check_four(mesh, path);
  cleanup(dir);
}

// While it lives, this rank cannot make a file longer than `bytes` (RLIMIT_FSIZE): the kernel
// refuses a reservation past it as a full disk would (EFBIG instead of ENOSPC).
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved_);
    signal_ = std::signal(SIGXFSZ, SIG_IGN);  // else the process is killed
    rlimit lower = saved_;
    lower.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lower);
  }
  FileSizeLimit(const FileSizeLimit&) = delete;
  FileSizeLimit& operator=(const FileSizeLimit&) = delete;
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved_);
    std::signal(SIGXFSZ, signal_);
  }

 private:
  rlimit saved_{};
  void (*signal_)(int) = nullptr;
};

TEST_CASE("a save with no room on rank 0 fails on every rank before writing") {
  // Open MPI 4.1's OMPIO loses a write's ENOSPC and then hangs in MPI_File_sync; the writers
  // reserve the whole file first (docs/multihost.md). Here only rank 0 lacks room.
  const fs::path dir = scratch_dir("no_room");
  const M2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  const std::string path = (dir / "ck.safetensors").string();
  write_four(mesh, path);
  const auto before = fs::file_size(path);
  const auto v =
      gshard::from_global<Sharded<float, M2, "R:x C">>(mesh, shape_a, exact_values<float>(35, 9));
  {
    std::optional<FileSizeLimit> limit;
    if (mesh.rank() == 0) limit.emplace(64);
    gshard::io::SafetensorsWriter w(mesh.comm());
    w.add("a", v);
    same_error_everywhere([&] { w.write(path); }, "cannot reserve");
    same_error_everywhere([&] { gshard::io::save_npy((dir / "a.npy").string(), v); },
                          "gshard::save_npy: cannot reserve");
  }
  CHECK(fs::file_size(path) == before);
  check_four(mesh, path);
  CHECK_FALSE(fs::exists(path + ".tmp"));
  CHECK_FALSE(fs::exists(dir / "a.npy"));
  cleanup(dir);
}

TEST_CASE("npy: round trip on every mesh, and bad headers") {
  const fs::path dir = scratch_dir("npy");
  gshard::test::TestMeshes meshes(world_size());
  for (const auto& mesh : meshes.m2) {
    INFO("mesh ", mesh.describe());
    const std::string path = (dir / "b.npy").string();
    const auto b = gshard::from_global<Sharded<double, M2, "P:y Q R:x">>(
        mesh, shape_b, exact_values<double>(72, 5));
    gshard::io::save_npy(path, b);
    const auto back = gshard::io::load_npy<Sharded<double, M2, "P Q:x*y R">>(mesh, path);
    CHECK(back.to_global() == exact_values<double>(72, 5));
    Sharded<std::int64_t, M2, "P Q R"> wrong(mesh, shape_b);
    same_error_everywhere([&] { gshard::io::load_npy_into(path, wrong); }, "dtype '<f8'");
  }
  const M2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  const std::string path = (dir / "bad.npy").string();
  on_root([&] {
    std::ofstream(path, std::ios::binary)
        << "\x93NUMPY\x01" << '\0' << "\x10" << '\0' << "{'descr': '<f4'}";
  });
  same_error_everywhere([&] { (void)gshard::io::load_npy<Sharded<float, M2, "A">>(mesh, path); },
                        "needs 'descr', 'fortran_order' and 'shape'");
  cleanup(dir);
}

}  // namespace
