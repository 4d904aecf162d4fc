#pragma once
// Files that every rank of a test reads and writes: one scratch directory per process group, and
// changes made by rank 0 alone between barriers.
#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "mpi_test.hpp"

namespace gshard::test {

/// A directory every rank agrees on, fresh for this process group.
inline std::filesystem::path scratch_dir(const std::string& what) {
  long long id = world_rank() == 0 ? static_cast<long long>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() /
      ("gshard_io_" + what + "_np" + std::to_string(world_size()) + "_" + std::to_string(id));
  if (world_rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  return dir;
}

inline void cleanup(const std::filesystem::path& dir) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

/// Rank 0 changes the file once every rank is done with it; the others wait.
template <class F>
void on_root(F&& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) f();
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace gshard::test
