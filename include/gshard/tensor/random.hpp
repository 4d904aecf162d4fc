#pragma once
// Counter-based random numbers: each value is a pure function of (seed, global index), so the
// same global tensor comes out on every mesh and layout.
#include <Kokkos_Core.hpp>
#include <concepts>
#include <cstdint>
#include <type_traits>

#include "../kernels/math.hpp"

namespace gshard {

namespace random_error {
template <class>
inline constexpr bool always_false = false;
template <auto Op, auto Spec>
struct needs_floating_point {
  static_assert(always_false<needs_floating_point>,
                "gshard random op: the tensor must hold float or double (the op, the spec)");
};
template <class F>
struct seed_must_be_an_integer {
  static_assert(sizeof(F) == 0,
                "gshard random op: a floating-point value was passed as the seed; the seed comes "
                "right after the tensor (or mesh and shape), before rate, range or moments");
};
}  // namespace random_error

/// The seed of a random op. Every random op takes it right after its tensor (or mesh and shape)
/// and before its options (rate, range, moments). Integers convert; a floating-point value is a
/// named compile error (random_error::seed_must_be_an_integer), so a swap cannot go silent.
struct Seed {
  std::uint64_t value = 0;
  template <std::integral I>
  constexpr Seed(I v) noexcept : value(static_cast<std::uint64_t>(v)) {}  // NOLINT: implicit
  template <std::floating_point F>
  constexpr Seed(F) noexcept {
    (void)sizeof(random_error::seed_must_be_an_integer<F>);
  }
};

}  // namespace gshard

namespace gshard::detail {

KOKKOS_INLINE_FUNCTION std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

/// 64 random bits for stream `stream` of element `index` under `seed`.
KOKKOS_INLINE_FUNCTION std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index,
                                                 std::uint64_t stream) {
  return splitmix64(splitmix64(seed ^ (stream * 0xD1B54A32D192ED03ULL)) + index);
}

/// Uniform in [0, 1) with 53 random bits.
KOKKOS_INLINE_FUNCTION double random_unit(std::uint64_t seed, std::uint64_t index,
                                          std::uint64_t stream) {
  return static_cast<double>(random_bits(seed, index, stream) >> 11) * 0x1.0p-53;
}

/// The value random_uniform gives element g: uniform in [low, high).
template <class T>
KOKKOS_INLINE_FUNCTION T uniform_value(std::uint64_t seed, std::int64_t g, T low, T high) {
  if constexpr (std::is_floating_point_v<T>) {
    const double u = random_unit(seed, static_cast<std::uint64_t>(g), 0);
    const T v = static_cast<T>(static_cast<double>(low) +
                               u * (static_cast<double>(high) - static_cast<double>(low)));
    return v < high ? v : low;  // rounding to T may reach high
  } else {
    const auto span = static_cast<std::uint64_t>(high - low);
    return static_cast<T>(
        low + static_cast<T>(random_bits(seed, static_cast<std::uint64_t>(g), 0) % span));
  }
}

/// Standard normal by Box-Muller, computed in double.
KOKKOS_INLINE_FUNCTION double random_standard_normal(std::uint64_t seed, std::uint64_t index) {
  const double u1 = 1.0 - random_unit(seed, index, 0);  // (0, 1]: log is finite
  const double u2 = random_unit(seed, index, 1);
  return math::sqrt(-2.0 * math::log(u1)) * math::cos(6.283185307179586 * u2);
}

}  // namespace gshard::detail
