// y = A x on a 2-D mesh, written against global shapes: A's rows are split over "rows", its
// columns over "cols", x is split like A's columns. Each rank multiplies its block in a Kokkos
// kernel, which leaves y as partial sums over "cols"; one reshard finishes them and another
// gathers y everywhere. Rank 0 prints the plans and checks y against Eigen on the whole matrix.
#include <Eigen/Dense>
#include <cmath>
#include <cstdio>
#include <gshard/gshard.hpp>
#include <vector>

namespace gs = gshard;

int main(int argc, char** argv) {
  gs::Environment env(argc, argv);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const int row_ranks = size % 2 == 0 ? size / 2 : size;  // 4 ranks: a 2x2 mesh
  using Mesh = gs::Mesh<"rows", "cols">;
  const Mesh mesh(MPI_COMM_WORLD, {row_ranks, size / row_ranks});

  using Matrix = gs::Sharded<double, Mesh, "R:rows C:cols">;
  using Vector = gs::Sharded<double, Mesh, "C:cols">;
  using Partial = gs::Sharded<double, Mesh, "R:rows +cols">;
  using RowSplit = gs::Sharded<double, Mesh, "R:rows">;
  using Whole = gs::Sharded<double, Mesh, "R">;
  const std::int64_t rows = 1001;  // uneven on purpose
  const std::int64_t cols = 250;

  bool ok = false;
  {
    const auto a = gs::random_normal<Matrix>(mesh, {rows, cols}, /*seed=*/7);
    const auto x = gs::random_uniform<Vector>(mesh, {cols}, /*seed=*/8);

    // The local product: this rank's rows times this rank's columns (padding holds zeros).
    Partial y_partial(mesh, {rows});
    const std::int64_t local_rows = a.local_shape()[0];
    const std::int64_t local_cols = a.local_shape()[1];
    auto av = a.local_view();
    auto xv = x.local_view();
    auto yv = y_partial.local_view();
    Kokkos::parallel_for(
        "local_matvec", Kokkos::RangePolicy<>(0, local_rows), KOKKOS_LAMBDA(std::int64_t i) {
          double sum = 0;
          for (std::int64_t j = 0; j < local_cols; ++j) sum += av(i * local_cols + j) * xv(j);
          yv(i) = sum;
        });

    const auto y = gs::reshard<RowSplit>(y_partial);  // ReduceScatter or AllReduce over "cols"
    const auto y_all = gs::reshard<Whole>(y);         // AllGather over "rows"
    const std::vector<double> result = y_all.to_global();

    // The reference: Eigen on the whole matrix, gathered independently of the reshards above.
    const std::vector<double> a_all = a.to_global();
    const std::vector<double> x_all = x.to_global();
    const Eigen::Map<const Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>
        a_eigen(a_all.data(), rows, cols);
    const Eigen::Map<const Eigen::VectorXd> x_eigen(x_all.data(), cols);
    const Eigen::VectorXd y_ref = a_eigen * x_eigen;
    double max_error = 0;
    for (std::int64_t i = 0; i < rows; ++i)
      max_error = std::max(max_error, std::abs(result[static_cast<std::size_t>(i)] - y_ref(i)));
    ok = max_error < 1e-9;

    if (mesh.rank() == 0) {
      std::printf("sharded_matvec: y = A x, A %lld x %lld on %s\n", static_cast<long long>(rows),
                  static_cast<long long>(cols), mesh.describe().c_str());
      std::printf("  A \"%s\": each rank holds a %lld x %lld block; x \"%s\"\n",
                  std::string(Matrix::spec_string()).c_str(), static_cast<long long>(local_rows),
                  static_cast<long long>(local_cols), std::string(Vector::spec_string()).c_str());
      std::printf("%s", gs::explain(gs::plan_reshard<RowSplit>(y_partial)).c_str());
      std::printf("%s", gs::explain(gs::plan_reshard<Whole>(y)).c_str());
      std::printf("  max |y - y_eigen| = %.3g: %s\n", max_error, ok ? "ok" : "WRONG");
    }
  }
  int all_ok = ok ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all_ok == 1 ? 0 : 1;
}
