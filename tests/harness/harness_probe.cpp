// Test cases that misbehave on purpose, run only by name (they are skipped by default), so that
// tests/CMakeLists.txt can check that the harness catches each kind of failure.
#include <chrono>
#include <thread>

#include "mpi_test.hpp"

TEST_CASE("probe:passes" * doctest::skip()) {
  int sum = 0;
  const int one = 1;
  MPI_Allreduce(&one, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(sum == gshard::test::world_size());
}

TEST_CASE("probe:fails-on-rank-3" * doctest::skip()) {
  const int rank = gshard::test::world_rank();
  CHECK(rank != 3);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("probe:hangs-on-rank-1" * doctest::skip()) {
  // Rank 1 never reaches the barrier, so every other rank waits forever.
  if (gshard::test::world_rank() == 1)
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  MPI_Barrier(MPI_COMM_WORLD);
}
