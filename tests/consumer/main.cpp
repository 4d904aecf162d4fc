// Sums 0..n-1 split over the ranks (a Kokkos reduction on each rank's block, then an MPI
// reduction) and compares with n(n-1)/2.
#include <cstdio>
#include <gshard/gshard.hpp>

int main(int argc, char** argv) {
  gshard::Environment env(argc, argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const long n = 1000003;
  const long begin = n * rank / size;
  const long end = n * (rank + 1) / size;
  long local = 0;
  Kokkos::parallel_reduce(
      "consumer_sum", Kokkos::RangePolicy<>(begin, end),
      KOKKOS_LAMBDA(const long i, long& acc) { acc += i; }, local);
  long total = 0;
  MPI_Allreduce(&local, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  const bool ok = total == n * (n - 1) / 2;
  if (rank == 0)
    std::printf("consumer: gshard %d.%d.%d, %d ranks, sum %ld: %s\n", gshard::version_major,
                gshard::version_minor, gshard::version_patch, size, total, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
