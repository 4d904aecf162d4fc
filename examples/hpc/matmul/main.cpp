// A distributed matrix multiply C = A B on a 2-D mesh of ranks, written as one einsum: A's rows
// are split over "x" and its columns over "y", B's rows over "x" and its columns over "y"
// (ScaLAPACK's 2-D block layout); the result's layout "I:x J:y" follows from the einsum rules,
// and the planner picks which operand moves by the bytes each choice sends (docs/design.md).
// Prints the plan (gshard::explain: the collectives and the bytes each rank sends) before
// running it, then the time, GFLOP/s and the bytes actually sent. bench/matmul.cpp compares the
// same against ScaLAPACK.
//
//   mpirun -n 4 matmul --m 4096 --n 4096 --k 4096 [--grid 2x2] [--reps 3] [--check]
//
// --check compares entries of C from every rank's block with a plain dot product.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <gshard/einsum.hpp>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>

#include "../cli.hpp"

namespace {

namespace gs = gshard;
using Mesh = gs::Mesh<"x", "y">;
using A = gs::Sharded<double, Mesh, "I:x K:y">;
using B = gs::Sharded<double, Mesh, "K:x J:y">;
using C = gs::Sharded<double, Mesh, "I:x J:y">;

struct Options {
  std::int64_t m = 2048, n = 2048, k = 2048;
  std::string grid;
  int reps = 3;
  bool check = false;
};

// Small multiples of 1/8: every product and sum is exact, so --check can ask for equality.
KOKKOS_INLINE_FUNCTION double a_value(std::int64_t i, std::int64_t k) {
  return static_cast<double>((i * 7 + k * 13) % 17 - 8) / 8.0;
}
KOKKOS_INLINE_FUNCTION double b_value(std::int64_t k, std::int64_t j) {
  return static_cast<double>((k * 5 + j * 11) % 19 - 9) / 8.0;
}

// Each rank fills its own block of the padded local shard from the global indices; padding (the
// last blocks of an uneven split) stays zero. Not a function of the spec: nvcc cannot name a
// device lambda inside one (docs/backends.md).
void fill(const Kokkos::View<double*>& v, const gs::Shape& padded, const gs::Shape& offset,
          const gs::Shape& valid, bool is_a) {
  const std::int64_t cols = padded[1], i0 = offset[0], j0 = offset[1], rows_valid = valid[0],
                     cols_valid = valid[1];
  Kokkos::parallel_for(
      "fill", Kokkos::RangePolicy<Kokkos::IndexType<std::int64_t>>(0, v.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t at) {
        const std::int64_t r = at / cols, c = at % cols;
        if (r < rows_valid && c < cols_valid)
          v(at) = is_a ? a_value(i0 + r, j0 + c) : b_value(i0 + r, j0 + c);
      });
}

template <class S>
S make(const Mesh& mesh, std::int64_t rows, std::int64_t cols, bool is_a) {
  S t(mesh, {rows, cols});  // zero-filled
  fill(t.local_view(), t.local_shape(), t.global_offsets(), t.valid_extents(), is_a);
  t.mark_modified();
  return t;
}

// Up to 8 x 8 entries spread over this rank's block of C, against dot products of the fills.
int count_wrong(const C& c, std::int64_t k) {
  const auto v = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c.local_view());
  const gs::Shape padded = c.local_shape(), offset = c.global_offsets(), valid = c.valid_extents();
  int wrong = 0;
  for (std::int64_t r = 0; r < valid[0]; r += std::max<std::int64_t>(1, valid[0] / 8))
    for (std::int64_t s = 0; s < valid[1]; s += std::max<std::int64_t>(1, valid[1] / 8)) {
      const std::int64_t i = offset[0] + r, j = offset[1] + s;
      double expect = 0;
      for (std::int64_t l = 0; l < k; ++l) expect += a_value(i, l) * b_value(l, j);
      wrong += v(r * padded[1] + s) == expect ? 0 : 1;
    }
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  return wrong;
}

int run(const Options& o) {
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  const auto [px, py] = hpc::grid_shape(o.grid, ranks, "--grid");
  const Mesh mesh(MPI_COMM_WORLD, {px, py});
  const bool root = mesh.rank() == 0;
  const A a = make<A>(mesh, o.m, o.k, true);
  const B b = make<B>(mesh, o.k, o.n, false);

  const auto product = gs::einsum<"IK,KJ->IJ">(a, b);  // lazy: nothing runs yet
  if (root)
    std::cout << "matmul: C = A B, m " << o.m << ", n " << o.n << ", k " << o.k << ", on "
              << mesh.describe() << "\n"
              << gs::explain(product);

  // Best of --reps after a warm-up; the counters cover the last multiply.
  double best = 1e300;
  long long sent = 0;
  std::optional<C> c;
  for (int rep = 0; rep <= o.reps; ++rep) {
    c.reset();  // the last result freed before the next is made
    gs::comm_counters().reset();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    // A fresh expression each time: an expression evaluates once and keeps its value.
    c = C(gs::einsum<"IK,KJ->IJ">(a, b));  // evaluated here, into C's layout
    Kokkos::fence();
    double t = MPI_Wtime() - t0;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (rep > 0) best = std::min(best, t);
    sent = gs::comm_counters().total().bytes;
  }
  MPI_Allreduce(MPI_IN_PLACE, &sent, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  const double flops =
      2.0 * static_cast<double>(o.m) * static_cast<double>(o.n) * static_cast<double>(o.k);
  if (root)
    std::printf("matmul: %.4f s, %.2f GFLOP/s, %lld bytes sent by the busiest rank\n", best,
                flops / best / 1e9, sent);
  if (!o.check) return 0;
  const int wrong = count_wrong(*c, o.k);
  if (root) std::printf("matmul: check against dot products: %s\n", wrong == 0 ? "ok" : "FAILED");
  return wrong == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  gs::Environment env(argc, argv);
  Options o;
  CLI::App app("C = A B over a 2-D mesh of ranks as one gshard einsum");
  app.add_option("--m", o.m, "rows of A and C");
  app.add_option("--n", o.n, "columns of B and C");
  app.add_option("--k", o.k, "columns of A, rows of B");
  app.add_option("--grid", o.grid, "ranks as PxQ (default: as square as possible, P <= Q)");
  app.add_option("--reps", o.reps, "timed multiplies after a warm-up; the best is reported")
      ->check(CLI::PositiveNumber);
  app.add_flag("--check", o.check, "compare entries of C with plain dot products");
  return hpc::parse_and_run(app, argc, argv, "matmul", [&] { return run(o); });
}
