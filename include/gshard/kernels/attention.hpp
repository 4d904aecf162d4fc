#pragma once
// The row kernels of fused attention (nn/attention.hpp): the masked softmax of one block of
// scores in place, and the softmax's backward, dS = P (dP - sum_t dP P) scale. Rows are (batch,
// head, query) triples of a [rows][T] block; a causal row s sees keys t <= s.
#include <Kokkos_Core.hpp>

#include <cstdint>

#include "math.hpp"

namespace gshard::detail {

/// scores[r][t] -> softmax over t < visible(r) (0 beyond), for every row r of [rows][t_len].
/// `s_len`: queries per (batch, head), so row r is query r % s_len.
template <class T>
void attention_softmax_rows(const Kokkos::View<T*>& scores, std::int64_t rows, std::int64_t s_len,
                            std::int64_t t_len, bool causal) {
  Kokkos::parallel_for(
      "gshard::attention softmax", Kokkos::RangePolicy<>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        T* p = scores.data() + r * t_len;
        const std::int64_t s = r % s_len;
        const std::int64_t visible = causal ? (s + 1 < t_len ? s + 1 : t_len) : t_len;
        T top = p[0];
        for (std::int64_t t = 1; t < visible; ++t) top = p[t] > top ? p[t] : top;
        T sum{};
        for (std::int64_t t = 0; t < visible; ++t) {
          p[t] = math::exp(p[t] - top);
          sum += p[t];
        }
        const T inv = static_cast<T>(1) / sum;
        for (std::int64_t t = 0; t < visible; ++t) p[t] *= inv;
        for (std::int64_t t = visible; t < t_len; ++t) p[t] = T{};
      });
}

/// dp[r][t] (the cotangent of the probabilities) -> the scores' cotangent, in place:
/// p (dp - sum_t dp p) scale. Masked entries (p = 0) get 0.
template <class T>
void attention_softmax_grad_rows(const Kokkos::View<T*>& dp, const Kokkos::View<T*>& p,
                                 std::int64_t rows, std::int64_t t_len, T scale) {
  Kokkos::parallel_for(
      "gshard::attention softmax grad", Kokkos::RangePolicy<>(0, rows),
      KOKKOS_LAMBDA(const std::int64_t r) {
        T* g = dp.data() + r * t_len;
        const T* pr = p.data() + r * t_len;
        T dot{};
        for (std::int64_t t = 0; t < t_len; ++t) dot += g[t] * pr[t];
        for (std::int64_t t = 0; t < t_len; ++t) g[t] = pr[t] * (g[t] - dot) * scale;
      });
}

}  // namespace gshard::detail
