#pragma once
// Test values that every element type holds exactly (small integers over 8, or integers), as a
// formula of the global index: files written by one side can be checked by another (numpy's
// tests/unit/io/interop_check.py has the same formula) without trusting either.
#include <cstdint>
#include <type_traits>
#include <vector>

namespace gshard::test {

template <class T>
std::vector<T> exact_values(std::int64_t n, int salt) {
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t k = (i * 37 + salt * 11) % 101 - 50;
    if constexpr (std::is_floating_point_v<T>)
      v[static_cast<std::size_t>(i)] = static_cast<T>(k) / T{8};
    else
      v[static_cast<std::size_t>(i)] = static_cast<T>(k * 1000 + i);
  }
  return v;
}

}  // namespace gshard::test
