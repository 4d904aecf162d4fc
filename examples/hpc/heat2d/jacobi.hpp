#pragma once
// One explicit step of the 2-D heat equation, u += r * (laplacian of u), as a 5-point Jacobi
// sweep over a block with one ghost cell on each side: the same code in examples/hpc/heat2d and
// in bench/heat2d (gshard's halo exchange against a hand-written one), so results can be equal
// to the last bit.
#include <Kokkos_Core.hpp>
#include <cstdint>

namespace heat2d {

KOKKOS_INLINE_FUNCTION double update(double c, double n, double s, double w, double e, double r) {
  return c + r * (n + s + w + e - 4.0 * c);
}

/// out(i, j) for the interior [1, m] x [1, n] of two views with one ghost cell around it.
template <class In, class Out>
void sweep(const In& in, const Out& out, std::int64_t m, std::int64_t n, double r) {
  if (m == 0 || n == 0) return;
  using Policy = Kokkos::MDRangePolicy<Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>;
  Kokkos::parallel_for(
      "heat2d::sweep", Policy({1, 1}, {m + 1, n + 1}),
      KOKKOS_LAMBDA(const std::int64_t i, const std::int64_t j) {
        out(i, j) = update(in(i, j), in(i - 1, j), in(i + 1, j), in(i, j - 1), in(i, j + 1), r);
      });
}

/// The initial temperature at global (i, j) of an ny x nx plate: two warm discs on a cold plate.
KOKKOS_INLINE_FUNCTION double initial(std::int64_t i, std::int64_t j, std::int64_t ny,
                                      std::int64_t nx) {
  const double y = (static_cast<double>(i) + 0.5) / static_cast<double>(ny);
  const double x = (static_cast<double>(j) + 0.5) / static_cast<double>(nx);
  const double a = (y - 0.4) * (y - 0.4) + (x - 0.35) * (x - 0.35);
  const double b = (y - 0.65) * (y - 0.65) + (x - 0.7) * (x - 0.7);
  return (a < 0.03 ? 1.0 : 0.0) + (b < 0.01 ? 0.5 : 0.0);
}

}  // namespace heat2d
