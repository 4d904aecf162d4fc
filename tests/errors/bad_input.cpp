// The bad-input suite: each case makes one mistake a user could make, on 4 ranks, as a whole
// program. main catches gshard::Error, prints "rank r: <what>" and exits 1, as a user's main
// would; tests/CMakeLists.txt runs every case under mpirun with a timeout and checks (through
// tests/harness/expect_failure.cmake) the exit, the time and that every rank printed the error.
//   bad_input <case>      (bad_input --list prints the cases)
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include <gshard/gshard.hpp>

namespace {

namespace fs = std::filesystem;
namespace gs = gshard;
using M2 = gs::Mesh<"x", "y">;
using M1 = gs::Mesh<"x">;

int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

int ranks() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// A file every rank agrees on (under the working directory CTest gives the case).
std::string file(const std::string& name) {
  return (fs::current_path() / ("bad_input_" + name)).string();
}

// Rank 0 changes a file while the others wait.
template <class F>
void on_root(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank() == 0) f();
  MPI_Barrier(MPI_COMM_WORLD);
}

// A small checkpoint: "w" [7, 5] float, "c" [11] int64.
std::string checkpoint(const std::string& name) {
  const M1 mesh(MPI_COMM_WORLD, {ranks()});
  const std::string path = file(name);
  gs::io::SafetensorsWriter w(mesh.comm());
  w.add("w", gs::from_global<gs::Sharded<float, M1, "R:x C">>(mesh, {7, 5},
                                                              std::vector<float>(35, 0.5f)));
  w.add("c", gs::from_global<gs::Sharded<std::int64_t, M1, "N:x">>(
                 mesh, {11}, std::vector<std::int64_t>(11, 3)));
  w.write(path);
  return path;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::string random_bytes(std::size_t n) {
  std::string s(n, '\0');
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (auto& c : s) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

using Case = std::function<void()>;

const std::map<std::string, Case>& cases() {
  static const std::map<std::string, Case> all = {
      // --- meshes and shapes ---
      {"mesh_does_not_match_communicator",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {3, 2});
       }},
      {"mesh_size_not_positive",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {0, 4});
       }},
      {"mesh_axis_count", [] { const M2 mesh(MPI_COMM_WORLD, {4}); }},
      {"shape_negative",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const gs::Sharded<float, M2, "A:x B"> t(mesh, {-1, 4});
       }},
      {"shape_rank_differs",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const gs::Sharded<float, M2, "A:x B"> t(mesh, {4});
       }},
      {"local_view_wrong_size",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const gs::Sharded<float, M2, "A:x B"> t(mesh, {4, 4}, Kokkos::View<float*>("v", 3));
       }},
      {"from_global_wrong_count",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         (void)gs::from_global<gs::Sharded<float, M2, "A:x B">>(mesh, {4, 4},
                                                                std::vector<float>(15));
       }},
      {"from_global_wrong_count_on_one_rank",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const std::vector<float> v(rank() == 3 ? 15 : 16, 1.0f);
         (void)gs::from_global<gs::Sharded<float, M2, "A:x B">>(mesh, {4, 4}, v);
       }},
      // --- ops ---
      {"einsum_sizes_disagree",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const gs::Sharded<float, M2, "I:x J"> a(mesh, {4, 5});
         const gs::Sharded<float, M2, "J K:y"> b(mesh, {6, 3});
         const gs::Sharded<float, M2, "I:x K:y"> c = gs::einsum<"IJ,JK->IK">(a, b);
       }},
      {"elementwise_sizes_disagree",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const gs::Sharded<float, M2, "A:x B"> a(mesh, {4, 5});
         const gs::Sharded<float, M2, "A:x B"> b(mesh, {4, 6});
         const gs::Sharded<float, M2, "A:x B"> c = a + b;
       }},
      {"index_out_of_range_on_one_rank",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {4, 1});
         const auto table = gs::from_global<gs::Sharded<float, M2, "G S M">>(
             mesh, {4, 5, 3}, std::vector<float>(60, 1.0f));
         std::vector<std::int64_t> ids(4 * 2 * 2, 1);
         ids.back() = 7;  // in the last group: on the last rank only
         const auto indices =
             gs::from_global<gs::Sharded<std::int64_t, M2, "G:x E C">>(mesh, {4, 2, 2}, ids);
         (void)gs::take_along<"S">(table, indices);
       }},
      {"top_k_larger_than_dimension",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const gs::Sharded<float, M2, "A:x B"> a(mesh, {4, 5});
         (void)gs::top_k<"B", "K">(a, 6);
       }},
      {"one_hot_size_not_positive",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         const gs::Sharded<std::int64_t, M2, "A:x"> a(mesh, {4});
         (void)gs::one_hot<"E">(a, 0);
       }},
      {"optimizer_gradient_shape",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         gs::Sharded<float, M2, "A:x B"> w(mesh, {4, 5});
         const gs::Sharded<float, M2, "A:x B"> g(mesh, {4, 6});
         gs::nn::Adam opt;
         opt.step(std::tie(w), std::tie(g));
       }},
      {"learning_rate_not_finite",
       [] {
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         gs::Sharded<float, M2, "A:x B"> w(mesh, {4, 5});
         const gs::Sharded<float, M2, "A:x B"> g(mesh, {4, 5});
         gs::nn::Sgd opt({.learning_rate = std::nan("")});
         opt.step(std::tie(w), std::tie(g));
       }},
      // --- files ---
      {"checkpoint_corrupt",
       [] {
         const std::string path = checkpoint("corrupt.safetensors");
         on_root([&] {
           std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
           f.seekp(-9, std::ios::end);
           f.put('\x55');
         });
         const M1 mesh(MPI_COMM_WORLD, {ranks()});
         gs::io::SafetensorsReader r(mesh.comm(), path);
         (void)r.read<gs::Sharded<std::int64_t, M1, "N:x">>(mesh, "c");
       }},
      {"checkpoint_truncated",
       [] {
         const std::string path = checkpoint("truncated.safetensors");
         on_root([&] { fs::resize_file(path, fs::file_size(path) - 16); });
         const M1 mesh(MPI_COMM_WORLD, {ranks()});
         gs::io::SafetensorsReader r(mesh.comm(), path);
       }},
      {"checkpoint_for_other_shapes",
       [] {
         const std::string path = checkpoint("shapes.safetensors");
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         gs::io::SafetensorsReader r(mesh.comm(), path);
         gs::Sharded<float, M2, "R:x C:y"> w(mesh, {5, 7});
         r.read_into("w", w);
       }},
      {"checkpoint_other_dtype",
       [] {
         const std::string path = checkpoint("dtype.safetensors");
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         gs::io::SafetensorsReader r(mesh.comm(), path);
         gs::Sharded<double, M2, "R:x C:y"> w(mesh, {7, 5});
         r.read_into("w", w);
       }},
      {"checkpoint_missing_tensor",
       [] {
         const std::string path = checkpoint("missing.safetensors");
         const M2 mesh(MPI_COMM_WORLD, {2, 2});
         gs::io::SafetensorsReader r(mesh.comm(), path);
         gs::Sharded<float, M2, "R:x C:y"> w(mesh, {7, 5});
         r.read_into("wo", w);
       }},
      {"checkpoint_random_bytes",
       [] {
         const std::string path = file("random.safetensors");
         on_root([&] { write_bytes(path, random_bytes(4096)); });
         const M1 mesh(MPI_COMM_WORLD, {ranks()});
         gs::io::SafetensorsReader r(mesh.comm(), path);
       }},
      {"checkpoint_header_not_json",
       [] {
         const std::string path = file("notjson.safetensors");
         on_root([&] {
           const std::string json = "{\"w\": [1, 2";
           std::string bytes(8, '\0');
           bytes[0] = static_cast<char>(json.size());
           write_bytes(path, bytes + json);
         });
         const M1 mesh(MPI_COMM_WORLD, {ranks()});
         gs::io::SafetensorsReader r(mesh.comm(), path);
       }},
      {"checkpoint_missing_file",
       [] {
         const M1 mesh(MPI_COMM_WORLD, {ranks()});
         gs::io::SafetensorsReader r(mesh.comm(), file("does_not_exist.safetensors"));
       }},
      {"npy_random_bytes",
       [] {
         const std::string path = file("random.npy");
         on_root([&] { write_bytes(path, random_bytes(256)); });
         const M1 mesh(MPI_COMM_WORLD, {ranks()});
         (void)gs::io::load_npy<gs::Sharded<float, M1, "A:x">>(mesh, path);
       }},
      {"npy_other_dtype",
       [] {
         const M1 mesh(MPI_COMM_WORLD, {ranks()});
         const std::string path = file("double.npy");
         gs::io::save_npy(path, gs::Sharded<double, M1, "A:x">(mesh, {9}));
         gs::Sharded<float, M1, "A:x"> t(mesh, {9});
         gs::io::load_npy_into(path, t);
       }},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  gs::Environment env(argc, argv);
  const std::string name = argc > 1 ? argv[1] : "";
  if (name == "--list") {
    if (rank() == 0)
      for (const auto& [n, c] : cases()) std::cout << n << "\n";
    return 0;
  }
  const auto it = cases().find(name);
  if (it == cases().end()) {
    if (rank() == 0) std::cerr << "bad_input: no case \"" << name << "\" (--list)\n";
    return 2;
  }
  try {
    it->second();
  } catch (const gs::Error& e) {
    // One write, so that the ranks' lines do not interleave.
    std::cerr << "rank " + std::to_string(rank()) + ": " + e.what() + "\n" << std::flush;
    return 1;
  }
  // The mistake went unnoticed: the test fails on the exit code.
  std::cerr << "rank " << rank() << ": no error" << std::endl;
  return 0;
}
