#pragma once
// The row kernels of fused attention (nn/attention.hpp): the masked softmax of one block of
// scores in place, and the softmax's backward, dS = P (dP - sum_t dP P) scale. Rows are (batch,
// head, query) triples of a [rows][T] block; a causal row s sees keys t <= s. A causal row is
// only written up to the end of its query block's key range (attention_width): the GEMMs around
// it skip the blocks above the diagonal and never read further.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "math.hpp"

namespace gshard::detail {

/// Queries per block of causal attention: the GEMMs skip the key blocks above the diagonal.
inline constexpr std::int64_t attention_block = 32;

/// The keys row s sees: t <= s (causal), else all t_len.
KOKKOS_INLINE_FUNCTION std::int64_t attention_visible(std::int64_t s, std::int64_t t_len,
                                                      bool causal) {
  return causal && s + 1 < t_len ? s + 1 : t_len;
}

/// The keys row s reads and writes: its query block's end (causal), else all t_len.
KOKKOS_INLINE_FUNCTION std::int64_t attention_width(std::int64_t s, std::int64_t t_len,
                                                    bool causal) {
  if (!causal) return t_len;
  const std::int64_t end = (s / attention_block + 1) * attention_block;
  return end < t_len ? end : t_len;
}

/// exp(x) for x in [-87, 0] (a softmax's shifted scores), in float: Cephes' polynomial after
/// reduction by ln 2, the power of two put into the exponent bits; within 2 ulp of expf. Plain
/// arithmetic without branches, so host loops over it vectorise (expf is a scalar libm call).
KOKKOS_INLINE_FUNCTION float exp_nonpositive(float x) {
  const float big = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer in the low bits
  const float t = x * 1.44269504088896341f + big;
  const float n = t - big;
  const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // t's low mantissa bits hold n; 2^n as a float is (n + 127) << 23. Unsigned: a NaN input's
  // bits wrap (its result stays NaN through p) instead of overflowing.
  std::uint32_t bits;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  bits = __float_as_uint(t);
#else
  std::memcpy(&bits, &t, sizeof bits);
#endif
  const std::uint32_t e = (bits - 0x4B400000u + 127u) << 23;
  float scale;
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
  scale = __uint_as_float(e);
#else
  std::memcpy(&scale, &e, sizeof scale);
#endif
  return p * scale;
}

/// p[t] = exp(p[t] - shift) for t < n, where p[t] <= shift. float: exp_nonpositive after a
/// clamp to -87 (so 1.6e-38 stands for anything smaller), in two loops that each vectorise (GCC
/// does not if-convert a clamp feeding arithmetic); other types, and -ffast-math builds (which
/// would fold the rounding constant away), take math::exp.
template <class T>
KOKKOS_INLINE_FUNCTION void exp_shifted(T* p, std::int64_t n, T shift) {
#if !defined(__FAST_MATH__)
  if constexpr (std::is_same_v<T, float>) {
    for (std::int64_t t = 0; t < n; ++t) {
      const float x = p[t] - shift;
      p[t] = x < -87.0f ? -87.0f : x;
    }
    for (std::int64_t t = 0; t < n; ++t) p[t] = exp_nonpositive(p[t]);
    return;
  }
#endif
  for (std::int64_t t = 0; t < n; ++t) p[t] = math::exp(p[t] - shift);
}

/// Max, sum and dot product of n values, with 8 independent accumulators so that host loops
/// vectorise (in a fixed order).
template <class T>
KOKKOS_INLINE_FUNCTION T row_max(const T* p, std::int64_t n) {
  T m[8];
  for (int j = 0; j < 8; ++j) m[j] = p[0];
  std::int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int j = 0; j < 8; ++j) m[j] = p[t + j] > m[j] ? p[t + j] : m[j];
  for (; t < n; ++t) m[0] = p[t] > m[0] ? p[t] : m[0];
  for (int j = 1; j < 8; ++j) m[0] = m[j] > m[0] ? m[j] : m[0];
  return m[0];
}

template <class T>
KOKKOS_INLINE_FUNCTION T row_sum(const T* p, std::int64_t n) {
  T s[8] = {};
  std::int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int j = 0; j < 8; ++j) s[j] += p[t + j];
  for (; t < n; ++t) s[0] += p[t];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

template <class T>
KOKKOS_INLINE_FUNCTION T row_dot(const T* a, const T* b, std::int64_t n) {
  T s[8] = {};
  std::int64_t t = 0;
  for (; t + 8 <= n; t += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[t + j] * b[t + j];
  for (; t < n; ++t) s[0] += a[t] * b[t];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/// scores[r][t] -> softmax over t < visible(r), 0 from there to the row's attention_width, for
/// every row r of [rows][t_len]. `s_len`: queries per (batch, head), so row r is query r % s_len.
template <class T>
void attention_softmax_rows(const Kokkos::View<T*>& scores, std::int64_t rows, std::int64_t s_len,
                            std::int64_t t_len, bool causal) {
  Kokkos::parallel_for(
      "gshard::attention softmax", Kokkos::RangePolicy<>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        T* p = scores.data() + r * t_len;
        const std::int64_t s = r % s_len;
        const std::int64_t visible = attention_visible(s, t_len, causal);
        const std::int64_t width = attention_width(s, t_len, causal);
        const T top = row_max(p, visible);
        exp_shifted(p, visible, top);
        const T sum = row_sum(p, visible);
        const T inv = static_cast<T>(1) / sum;
        for (std::int64_t u = 0; u < visible; ++u) p[u] *= inv;
        for (std::int64_t u = visible; u < width; ++u) p[u] = T{};
      });
}

/// dp[r][t] (the cotangent of the probabilities) -> the scores' cotangent, in place, up to the
/// row's attention_width: p (dp - sum_t dp p) scale; masked entries get 0.
template <class T>
void attention_softmax_grad_rows(const Kokkos::View<T*>& dp, const Kokkos::View<T*>& p,
                                 std::int64_t rows, std::int64_t s_len, std::int64_t t_len,
                                 bool causal, T scale) {
  Kokkos::parallel_for(
      "gshard::attention softmax grad", Kokkos::RangePolicy<>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        T* g = dp.data() + r * t_len;
        const T* pr = p.data() + r * t_len;
        const std::int64_t s = r % s_len;
        const std::int64_t visible = attention_visible(s, t_len, causal);
        const std::int64_t width = attention_width(s, t_len, causal);
        const T dot = row_dot(g, pr, visible);
        for (std::int64_t t = 0; t < visible; ++t) g[t] = pr[t] * (g[t] - dot) * scale;
        for (std::int64_t t = visible; t < width; ++t) g[t] = T{};
      });
}

}  // namespace gshard::detail
