// A sharded computation on any number of ranks: y = A x with the rows of A split over the ranks
// (uneven blocks when the rank count does not divide the rows). Each rank builds its own rows,
// multiplies them in a Kokkos kernel, and an MPI all-gather assembles y on every rank; rank 0
// checks y against Eigen on the whole matrix and says what each rank did.
#include <Eigen/Dense>
#include <cmath>
#include <cstdio>
#include <gshard/gshard.hpp>
#include <vector>

namespace {
constexpr int rows = 1001;
constexpr int cols = 256;
KOKKOS_INLINE_FUNCTION double a_entry(int i, int j) { return std::sin(0.01 * i + 0.02 * j); }
KOKKOS_INLINE_FUNCTION double x_entry(int j) { return 1.0 / (1.0 + j); }
}  // namespace

int main(int argc, char** argv) {
  gshard::Environment env(argc, argv);
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  // Block rows [begin, end) of rank r: the first rows % size ranks hold one extra row.
  std::vector<int> counts(static_cast<std::size_t>(size));
  std::vector<int> offsets(static_cast<std::size_t>(size));
  for (int r = 0, offset = 0; r < size; ++r) {
    counts[static_cast<std::size_t>(r)] = rows / size + (r < rows % size ? 1 : 0);
    offsets[static_cast<std::size_t>(r)] = offset;
    offset += counts[static_cast<std::size_t>(r)];
  }
  const int begin = offsets[static_cast<std::size_t>(rank)];
  const int local_rows = counts[static_cast<std::size_t>(rank)];

  {
    Kokkos::View<double**> a("a_local", local_rows, cols);
    Kokkos::View<double*> x("x", cols);
    Kokkos::View<double*> y("y_local", local_rows);
    Kokkos::parallel_for(
        "fill_a", Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0}, {local_rows, cols}),
        KOKKOS_LAMBDA(const int i, const int j) { a(i, j) = a_entry(begin + i, j); });
    Kokkos::parallel_for(
        "fill_x", Kokkos::RangePolicy<>(0, cols),
        KOKKOS_LAMBDA(const int j) { x(j) = x_entry(j); });
    Kokkos::parallel_for(
        "matvec", Kokkos::RangePolicy<>(0, local_rows), KOKKOS_LAMBDA(const int i) {
          double sum = 0;
          for (int j = 0; j < cols; ++j) sum += a(i, j) * x(j);
          y(i) = sum;
        });
    auto y_host = Kokkos::create_mirror_view(y);
    Kokkos::deep_copy(y_host, y);

    std::vector<double> y_all(rows);
    MPI_Allgatherv(y_host.data(), local_rows, MPI_DOUBLE, y_all.data(), counts.data(),
                   offsets.data(), MPI_DOUBLE, MPI_COMM_WORLD);

    // The reference: the whole product on one rank, with Eigen.
    Eigen::MatrixXd a_full(rows, cols);
    Eigen::VectorXd x_full(cols);
    for (int i = 0; i < rows; ++i)
      for (int j = 0; j < cols; ++j) a_full(i, j) = a_entry(i, j);
    for (int j = 0; j < cols; ++j) x_full(j) = x_entry(j);
    const Eigen::VectorXd y_ref = a_full * x_full;
    double max_error = 0;
    for (int i = 0; i < rows; ++i) max_error = std::max(max_error, std::abs(y_all[i] - y_ref(i)));
    const bool ok = max_error < 1e-10;

    if (rank == 0) {
      std::printf("sharded_matvec: y = A x with A %d x %d, rows split over %d rank(s)\n", rows,
                  cols, size);
      for (int r = 0; r < size; ++r)
        std::printf("  rank %d multiplied rows [%d, %d)\n", r, offsets[static_cast<std::size_t>(r)],
                    offsets[static_cast<std::size_t>(r)] + counts[static_cast<std::size_t>(r)]);
      std::printf("  all-gathered y (%d values) on every rank; max |y - y_eigen| = %.3g: %s\n",
                  rows, max_error, ok ? "ok" : "WRONG");
    }
    int all_ok = ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (all_ok == 0) return 1;
  }
  return 0;
}
