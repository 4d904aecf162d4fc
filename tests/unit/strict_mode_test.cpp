// Strict mode (built with GSHARD_STRICT): a program whose communication is all written out
// compiles and computes the same values; tests/compile_fail/strict_* show what it rejects.
#include <algorithm>
#include <cmath>
#include <vector>

#include "mpi_test.hpp"

#if !defined(GSHARD_STRICT)
#error "this test is built with GSHARD_STRICT"
#endif

namespace gs = gshard;
using gshard::test::world_size;

TEST_CASE("strict mode: explicit reshards compile and give the values of a naive loop") {
  static_assert(gs::strict_mode);
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n % 2 == 0 ? 2 : 1, n % 2 == 0 ? n / 2 : n});
  using A = gs::Sharded<double, M, "I:x K:y">;
  using B = gs::Sharded<double, M, "K:y J">;
  using C = gs::Sharded<double, M, "J">;
  const std::int64_t I = 5, K = 7, J = 6;
  const auto a = gs::random_normal<A>(mesh, {I, K}, 1);
  const auto b = gs::random_normal<B>(mesh, {K, J}, 2);
  const auto c = gs::random_normal<C>(mesh, {J}, 3);
  // The einsum's operands are split as its rules want (no implicit reshard); its result is a
  // partial sum over y, which relu may not see: the ReduceScatter is written out.
  const auto h = gs::einsum<"IK,KJ->IJ">(a, b);
  const auto hs = gs::reshard<gs::Sharded<double, M, "I:x J:y">>(h);
  const gs::Sharded<double, M, "I:x J:y"> r = gs::relu(hs) * 2.0 + c;  // c is sliced locally
  const auto ga = a.to_global(), gb = b.to_global(), gc = c.to_global(), gr = r.to_global();
  double worst = 0;
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t j = 0; j < J; ++j) {
      double s = 0;
      for (std::int64_t k = 0; k < K; ++k)
        s += ga[static_cast<std::size_t>(i * K + k)] * gb[static_cast<std::size_t>(k * J + j)];
      const double want = std::max(s, 0.0) * 2.0 + gc[static_cast<std::size_t>(j)];
      worst = std::max(worst, std::abs(gr[static_cast<std::size_t>(i * J + j)] - want));
    }
  CHECK(worst < 1e-12);
}
