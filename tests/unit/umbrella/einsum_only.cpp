// Meshes, sharded tensors and einsum from gshard/einsum.hpp alone (built without the tests'
// precompiled header, which holds all of gshard), checked against a naive loop; with the
// layouts-only and forward-declaration units linked beside it.
#include <gshard/einsum.hpp>

#include <cstdint>
#include <vector>

#include "mpi_test.hpp"

namespace umbrella {
int inferred_output_rank();
using M = gshard::Mesh<"x">;
using V = gshard::Sharded<double, M, "I:x">;
std::vector<double> through_fwd(const V& v);
std::vector<double> doubled(const V& v) { return (v * 2.0).to_global(); }
}  // namespace umbrella

TEST_CASE(
    "umbrella headers: einsum.hpp alone runs a sharded matmul; layouts.hpp and "
    "gshard_fwd.hpp link beside it") {
  namespace gs = gshard;
  const int n = gshard::test::world_size();
  using M2 = gs::Mesh<"x", "y">;
  const M2 mesh(MPI_COMM_WORLD, {n, 1});
  using A = gs::Sharded<double, M2, "I:x K">;
  using B = gs::Sharded<double, M2, "K J">;
  const std::int64_t I = 2 * n + 1, K = 5, J = 3;  // uneven over x
  std::vector<double> a(static_cast<std::size_t>(I * K)), b(static_cast<std::size_t>(K * J));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5 + static_cast<double>(i % 7);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = 1.0 - 0.25 * static_cast<double>(i % 5);
  const auto ta = gs::from_global<A>(mesh, {I, K}, a);
  const auto tb = gs::from_global<B>(mesh, {K, J}, b);
  const gs::Sharded<double, M2, "I:x J"> c = gs::einsum<"IK,KJ->IJ">(ta, tb);
  const std::vector<double> got = c.to_global();
  for (std::int64_t i = 0; i < I; ++i)
    for (std::int64_t j = 0; j < J; ++j) {
      double want = 0;
      for (std::int64_t k = 0; k < K; ++k)
        want += a[static_cast<std::size_t>(i * K + k)] * b[static_cast<std::size_t>(k * J + j)];
      CHECK(got[static_cast<std::size_t>(i * J + j)] == doctest::Approx(want));
    }
  CHECK(umbrella::inferred_output_rank() == 4);
  const umbrella::M line(MPI_COMM_WORLD, {n});
  const std::vector<double> v{1, 2, 3, 4, 5};
  const auto twice = umbrella::through_fwd(gs::from_global<umbrella::V>(line, {5}, v));
  CHECK(twice == std::vector<double>{2, 4, 6, 8, 10});
}
