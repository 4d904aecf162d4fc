#pragma once
// The best one-core sgemm rate on a layer's GEMM shapes, the GEMM-bound limit the MoE benches
// measure a step against: OpenBLAS's cblas_sgemm where gshard uses it, else Eigen.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#if defined(GSHARD_HAVE_CBLAS)
#include <cblas.h>
#else
#include <Eigen/Core>
#endif

namespace bench {

/// GFLOP/s of the fastest of `reps` runs (after one warm-up) of [rows, m] x [m, h] and of
/// [rows, h] x [h, m], whichever is faster.
inline double gemm_gflops(std::int64_t rows, std::int64_t m, std::int64_t h, int reps) {
  rows = std::max<std::int64_t>(rows, 1);
  std::vector<float> a(static_cast<std::size_t>(rows * std::max(m, h)), 0.5f);
  std::vector<float> b(static_cast<std::size_t>(m * h), 0.25f);
  std::vector<float> c(static_cast<std::size_t>(rows * std::max(m, h)), 0.0f);
  double best = 0;
  for (const auto& [k, n] : {std::pair{m, h}, std::pair{h, m}}) {
    std::vector<double> times;
    for (int i = 0; i < reps + 1; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
#if defined(GSHARD_HAVE_CBLAS)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
                  static_cast<int>(n), static_cast<int>(k), 1.0f, a.data(), static_cast<int>(k),
                  b.data(), static_cast<int>(n), 0.0f, c.data(), static_cast<int>(n));
#else
      using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::Map<Mat>(c.data(), rows, n).noalias() =
          Eigen::Map<const Mat>(a.data(), rows, k) * Eigen::Map<const Mat>(b.data(), k, n);
#endif
      const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - t0;
      if (i > 0) times.push_back(dt.count());
    }
    const double fastest = *std::min_element(times.begin(), times.end());
    best = std::max(best, 2.0 * static_cast<double>(rows * k * n) / fastest / 1e9);
  }
  return best;
}

}  // namespace bench
