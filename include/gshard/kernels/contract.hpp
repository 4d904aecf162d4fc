#pragma once
// The local part of an einsum: contract two row-major blocks given their labels, as batched GEMM.
// Labels only in one operand and not in the output are summed first; then each operand is viewed
// as [batch, m, k] / [batch, k, n] (or their transposes), copying only when the labels are not
// already grouped that way; the product lands in the output directly when its order allows.
//
// GEMM back ends, one per execution space (GemmVendor): on a host execution space OpenBLAS through
// CBLAS for float/double when the build found it (GSHARD_HAVE_CBLAS), Eigen in builds without
// it; cuBLAS under CUDA (GSHARD_HAVE_CUBLAS), hipBLAS under HIP (GSHARD_HAVE_HIPBLAS); a Kokkos
// kernel where no vendor library serves (integers, which BLAS lacks, in BLAS builds).
#include <Kokkos_Core.hpp>
// Eigen serves host execution spaces in builds without BLAS only: under a device backend its CUDA
// support would compile host-device code calling host functions, and with BLAS its headers would
// cost every translation unit about 0.4 s of parsing for the rare integer GEMM.
#if !defined(KOKKOS_ENABLE_CUDA) && !defined(KOKKOS_ENABLE_HIP) && !defined(KOKKOS_ENABLE_SYCL) && \
    !defined(GSHARD_HAVE_CBLAS)
#define GSHARD_HOST_GEMM_EIGEN 1
#include <Eigen/Core>
#endif
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "copy_box.hpp"
#include "flops.hpp"
#include "math.hpp"

#if defined(GSHARD_HAVE_CBLAS)
#include <cblas.h>
#endif
#if defined(KOKKOS_ENABLE_CUDA) && defined(GSHARD_HAVE_CUBLAS)
#include <cublas_v2.h>
#endif
#if defined(KOKKOS_ENABLE_HIP) && defined(GSHARD_HAVE_HIPBLAS)
#include <hipblas/hipblas.h>
#endif

namespace gshard::detail {

/// A local block: its labels in memory order and its (padded) extents.
struct LocalBlock {
  std::string labels;
  std::vector<std::int64_t> extents;

  [[nodiscard]] std::int64_t extent(char c) const {
    const auto p = labels.find(c);
    return p == std::string::npos ? 1 : extents[p];
  }
  [[nodiscard]] std::int64_t size() const {
    std::int64_t n = 1;
    for (auto e : extents) n *= e;
    return n;
  }
};

/// The shape of the batched GEMM an einsum's local part runs: for explain() and the bench.
struct GemmShape {
  std::int64_t batch = 1, m = 1, n = 1, k = 1;
};

/// `in` with the labels in `order` (a permutation of in.labels), into `out` (row-major).
template <class T>
void permute_block(const T* in, const LocalBlock& from, T* out, std::string_view order) {
  BoxCopy c;
  c.rank = static_cast<int>(order.size());
  std::int64_t from_stride[max_dims];
  row_major_strides(c.rank, from.extents.data(), from_stride);
  std::int64_t to_ext[max_dims];
  for (int d = 0; d < c.rank; ++d) to_ext[d] = from.extent(order[static_cast<std::size_t>(d)]);
  row_major_strides(c.rank, to_ext, c.dst_stride);
  for (int d = 0; d < c.rank; ++d) {
    c.box[d] = to_ext[d];
    c.src_stride[d] = from_stride[from.labels.find(order[static_cast<std::size_t>(d)])];
  }
  copy_box(in, out, c);
}

/// The block `from` leaves after summing out the labels not in `keep` (sum_out's result).
inline LocalBlock kept_block(const LocalBlock& from, const std::string& keep) {
  LocalBlock to;
  for (std::size_t d = 0; d < from.labels.size(); ++d)
    if (keep.find(from.labels[d]) != std::string::npos) {
      to.labels += from.labels[d];
      to.extents.push_back(from.extents[d]);
    }
  return to;
}

/// What sum_out's kernel captures: a type at namespace scope, as nvcc requires of a device
/// lambda's captures.
struct SumOutPlan {
  int kept = 0, summed = 0;
  std::int64_t kept_ext[max_dims]{}, kept_stride[max_dims]{};
  std::int64_t sum_ext[max_dims]{}, sum_stride[max_dims]{};
};

/// Columns per host iteration of sum_out's column sums (one on devices: a thread per column).
inline constexpr std::int64_t sum_chunk =
    std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace> ? 64 : 1;

/// Sums `in` over the labels not in `keep` (keeping their order).
template <class T>
Kokkos::View<T*> sum_out(const T* in, const LocalBlock& from, const std::string& keep,
                         LocalBlock& to) {
  to = kept_block(from, keep);
  std::int64_t stride[max_dims];
  row_major_strides(static_cast<int>(from.labels.size()), from.extents.data(), stride);
  SumOutPlan p;
  for (std::size_t d = 0; d < from.labels.size(); ++d) {
    if (keep.find(from.labels[d]) != std::string::npos) {
      p.kept_ext[p.kept] = from.extents[d];
      p.kept_stride[p.kept++] = stride[d];
    } else {
      p.sum_ext[p.summed] = from.extents[d];
      p.sum_stride[p.summed++] = stride[d];
    }
  }
  std::int64_t sum_count = 1;
  for (int i = 0; i < p.summed; ++i) sum_count *= p.sum_ext[i];
  Kokkos::View<T*> out(
      Kokkos::view_alloc(std::string("gshard::einsum::sum"), Kokkos::WithoutInitializing),
      to.size());
  const std::int64_t kept_size = to.size();
  const std::size_t nk = to.labels.size();
  // The usual cases without an index decode per element, each output summed in the same order
  // as below (bitwise the same): the summed labels all lead (column sums, e.g. a bias's gradient
  // "B S M -> M"), or all trail (row sums).
  if (nk > 0 && from.labels.compare(from.labels.size() - nk, nk, to.labels) == 0) {
    // One host iteration per chunk of columns, rows streamed in order; one thread per column on a
    // device (neighbouring threads read neighbouring columns).
    const std::int64_t chunks = (kept_size + sum_chunk - 1) / sum_chunk;
    Kokkos::parallel_for(
        "gshard::einsum::sum columns", Kokkos::RangePolicy<>(0, chunks),
        KOKKOS_LAMBDA(std::int64_t c) {
          const std::int64_t k0 = c * sum_chunk;
          const std::int64_t n = kept_size - k0 < sum_chunk ? kept_size - k0 : sum_chunk;
          T acc[sum_chunk] = {};
          for (std::int64_t j = 0; j < sum_count; ++j) {
            const T* row = in + j * kept_size + k0;
            for (std::int64_t k = 0; k < n; ++k) acc[k] += row[k];
          }
          for (std::int64_t k = 0; k < n; ++k) out(k0 + k) = acc[k];
        });
    return out;
  }
  if (nk > 0 && from.labels.compare(0, nk, to.labels) == 0) {
    Kokkos::parallel_for(
        "gshard::einsum::sum rows", Kokkos::RangePolicy<>(0, kept_size),
        KOKKOS_LAMBDA(std::int64_t i) {
          const T* row = in + i * sum_count;
          T acc{};
          for (std::int64_t j = 0; j < sum_count; ++j) acc += row[j];
          out(i) = acc;
        });
    return out;
  }
  Kokkos::parallel_for(
      "gshard::einsum::sum", Kokkos::RangePolicy<>(0, to.size()), KOKKOS_LAMBDA(std::int64_t i) {
        std::int64_t base = 0;
        for (std::int64_t d = p.kept - 1, rest = i; d >= 0; --d) {
          base += (rest % p.kept_ext[d]) * p.kept_stride[d];
          rest /= p.kept_ext[d];
        }
        T acc{};
        for (std::int64_t j = 0; j < sum_count; ++j) {
          std::int64_t off = 0;
          std::int64_t r = j;
          for (int d = p.summed - 1; d >= 0; --d) {
            off += (r % p.sum_ext[d]) * p.sum_stride[d];
            r /= p.sum_ext[d];
          }
          acc += in[base + off];
        }
        out(i) = acc;
      });
  return out;
}

/// Whether kernels run on the host. Decided by the execution space, not by memory
/// accessibility: CUDA's UVM and shared spaces are host-accessible, but a host BLAS reading them
/// would race with device kernels still writing.
inline constexpr bool host_execution =
    std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>;

template <class T>
inline constexpr bool blas_type = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// BLAS takes int sizes; k = 0 is left to the other paths (BLAS rejects a leading dimension 0).
inline bool blas_fits(const GemmShape& s) {
  constexpr std::int64_t max = std::numeric_limits<int>::max();
  return s.k > 0 && s.m <= max && s.n <= max && s.k <= max && s.batch <= max;
}

#if defined(GSHARD_HOST_GEMM_EIGEN)
template <class T>
void gemm_eigen(const T* a, bool trans_a, const T* b, bool trans_b, T* c, const GemmShape& s) {
  using Matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using ConstMap = Eigen::Map<const Matrix>;
  for (std::int64_t i = 0; i < s.batch; ++i) {
    Eigen::Map<Matrix> cm(c + i * s.m * s.n, s.m, s.n);
    if (s.k == 0) {
      cm.setZero();
      continue;
    }
    const ConstMap am(a + i * s.m * s.k, trans_a ? s.k : s.m, trans_a ? s.m : s.k);
    const ConstMap bm(b + i * s.k * s.n, trans_b ? s.n : s.k, trans_b ? s.k : s.n);
    if (!trans_a && !trans_b)
      cm.noalias() = am * bm;
    else if (trans_a && !trans_b)
      cm.noalias() = am.transpose() * bm;
    else if (!trans_a && trans_b)
      cm.noalias() = am * bm.transpose();
    else
      cm.noalias() = am.transpose() * bm.transpose();
  }
}

#endif

/// The vendor library that runs an execution space's GEMMs.
enum class GemmVendor { cblas, eigen, cublas, hipblas, kokkos };

template <class ExecSpace, class T>
constexpr GemmVendor gemm_vendor() {
  if constexpr (std::is_same_v<ExecSpace, Kokkos::DefaultHostExecutionSpace>) {
#if defined(GSHARD_HAVE_CBLAS)
    if constexpr (blas_type<T>) return GemmVendor::cblas;
#endif
#if defined(GSHARD_HOST_GEMM_EIGEN)
    return GemmVendor::eigen;
#else
    return GemmVendor::kokkos;
#endif
  }
#if defined(KOKKOS_ENABLE_CUDA) && defined(GSHARD_HAVE_CUBLAS)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::Cuda> && blas_type<T>) return GemmVendor::cublas;
#endif
#if defined(KOKKOS_ENABLE_HIP) && defined(GSHARD_HAVE_HIPBLAS)
  if constexpr (std::is_same_v<ExecSpace, Kokkos::HIP> && blas_type<T>) return GemmVendor::hipblas;
#endif
  return GemmVendor::kokkos;
}

/// The vendor names a GEMM of T would use here, for explain() and the benchmarks.
template <class T>
constexpr const char* gemm_vendor_name() {
  switch (gemm_vendor<Kokkos::DefaultExecutionSpace, T>()) {
    case GemmVendor::cblas:
      return "OpenBLAS";
    case GemmVendor::eigen:
      return "Eigen";
    case GemmVendor::cublas:
      return "cuBLAS";
    case GemmVendor::hipblas:
      return "hipBLAS";
    default:
      return "Kokkos kernel";
  }
}

#if defined(KOKKOS_ENABLE_CUDA) && defined(GSHARD_HAVE_CUBLAS)
/// One handle per process, never destroyed: destroying it at exit would run after
/// Kokkos::finalize has torn CUDA down.
inline cublasHandle_t cublas_handle() {
  static const cublasHandle_t handle = [] {
    cublasHandle_t h = nullptr;
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw Error("einsum", "cublasCreate failed");
    return h;
  }();
  return handle;
}
#endif

#if defined(KOKKOS_ENABLE_HIP) && defined(GSHARD_HAVE_HIPBLAS)
inline hipblasHandle_t hipblas_handle() {
  static const hipblasHandle_t handle = [] {
    hipblasHandle_t h = nullptr;
    if (hipblasCreate(&h) != HIPBLAS_STATUS_SUCCESS) throw Error("einsum", "hipblasCreate failed");
    return h;
  }();
  return handle;
}
#endif

/// Leading dimensions, batch strides and scalars of gemm_strided: C[i] = alpha op(A[i]) op(B[i])
/// + beta C[i], where X[i] starts at x + i * stride_x and its rows are ld_x elements apart.
/// Matrices inside larger row-major blocks (one head of "B S N D": rows N D apart) need no copy.
struct GemmStrides {
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
  double alpha = 1, beta = 0;
};

/// Tests set it to run gemm_strided's portable kernel where a vendor library would run.
inline bool& portable_gemm_forced() {
  static bool forced = false;
  return forced;
}

/// The portable strided GEMM: one thread per output element.
template <class T>
void gemm_strided_kokkos(const T* a, bool trans_a, const T* b, bool trans_b, T* c,
                         const GemmShape& s, const GemmStrides& st) {
  const T alpha = static_cast<T>(st.alpha), beta = static_cast<T>(st.beta);
  Kokkos::parallel_for(
      "gshard::gemm_strided", Kokkos::RangePolicy<>(0, s.batch * s.m * s.n),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t j = idx % s.n;
        const std::int64_t i = (idx / s.n) % s.m;
        const std::int64_t bb = idx / (s.n * s.m);
        const T* ab = a + bb * st.stride_a;
        const T* bp = b + bb * st.stride_b;
        T acc{};
        for (std::int64_t k = 0; k < s.k; ++k)
          acc += (trans_a ? ab[k * st.lda + i] : ab[i * st.lda + k]) *
                 (trans_b ? bp[j * st.ldb + k] : bp[k * st.ldb + j]);
        T& out = c[bb * st.stride_c + i * st.ldc + j];
        out = beta == T{} ? alpha * acc : alpha * acc + beta * out;
      });
}

/// Strided batched GEMM on the default execution space's vendor library (OpenBLAS per batch,
/// cuBLAS and hipBLAS strided-batched), else the portable kernel. Row-major; op transposes the
/// operand stored [k][m] (A) or [n][k] (B). Counts its FLOPs.
template <class T>
void gemm_strided(const T* a, bool trans_a, const T* b, bool trans_b, T* c, const GemmShape& s,
                  const GemmStrides& st) {
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  flop_counters().add_contraction(2 * s.batch * s.m * s.n * s.k);
  constexpr GemmVendor vendor = gemm_vendor<Kokkos::DefaultExecutionSpace, T>();
  constexpr std::int64_t max = std::numeric_limits<int>::max();
  const bool fits =
      blas_fits(s) && st.lda <= max && st.ldb <= max && st.ldc <= max && !portable_gemm_forced();
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  const int lda = static_cast<int>(st.lda), ldb = static_cast<int>(st.ldb),
            ldc = static_cast<int>(st.ldc);
  const T alpha = static_cast<T>(st.alpha), beta = static_cast<T>(st.beta);
  (void)m, (void)n, (void)k, (void)lda, (void)ldb, (void)ldc, (void)alpha, (void)beta, (void)fits;
#if defined(GSHARD_HAVE_CBLAS)
  if constexpr (vendor == GemmVendor::cblas) {
    if (fits) {
      const auto op_a = trans_a ? CblasTrans : CblasNoTrans;
      const auto op_b = trans_b ? CblasTrans : CblasNoTrans;
      for (std::int64_t i = 0; i < s.batch; ++i) {
        const T* ai = a + i * st.stride_a;
        const T* bi = b + i * st.stride_b;
        T* ci = c + i * st.stride_c;
        if constexpr (std::is_same_v<T, float>)
          cblas_sgemm(CblasRowMajor, op_a, op_b, m, n, k, alpha, ai, lda, bi, ldb, beta, ci, ldc);
        else
          cblas_dgemm(CblasRowMajor, op_a, op_b, m, n, k, alpha, ai, lda, bi, ldb, beta, ci, ldc);
      }
      return;
    }
  }
#endif
#if defined(KOKKOS_ENABLE_CUDA) && defined(GSHARD_HAVE_CUBLAS)
  // Column-major: C^T = op(B)^T op(A)^T, B first (gemm_cublas).
  if constexpr (vendor == GemmVendor::cublas) {
    if (fits) {
      const cublasHandle_t h = cublas_handle();
      cublasSetStream(h, Kokkos::DefaultExecutionSpace().cuda_stream());
      const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
      const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
      cublasStatus_t r;
      if constexpr (std::is_same_v<T, float>)
        r = cublasSgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, st.stride_b, a, lda,
                                      st.stride_a, &beta, c, ldc, st.stride_c,
                                      static_cast<int>(s.batch));
      else
        r = cublasDgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, st.stride_b, a, lda,
                                      st.stride_a, &beta, c, ldc, st.stride_c,
                                      static_cast<int>(s.batch));
      if (r != CUBLAS_STATUS_SUCCESS)
        throw Error("gemm_strided",
                    "cuBLAS GEMM failed with status " + std::to_string(static_cast<int>(r)));
      return;
    }
  }
#endif
#if defined(KOKKOS_ENABLE_HIP) && defined(GSHARD_HAVE_HIPBLAS)
  if constexpr (vendor == GemmVendor::hipblas) {
    if (fits) {
      const hipblasHandle_t h = hipblas_handle();
      hipblasSetStream(h, Kokkos::DefaultExecutionSpace().hip_stream());
      const hipblasOperation_t op_a = trans_a ? HIPBLAS_OP_T : HIPBLAS_OP_N;
      const hipblasOperation_t op_b = trans_b ? HIPBLAS_OP_T : HIPBLAS_OP_N;
      hipblasStatus_t r;
      if constexpr (std::is_same_v<T, float>)
        r = hipblasSgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, st.stride_b, a, lda,
                                       st.stride_a, &beta, c, ldc, st.stride_c,
                                       static_cast<int>(s.batch));
      else
        r = hipblasDgemmStridedBatched(h, op_b, op_a, n, m, k, &alpha, b, ldb, st.stride_b, a, lda,
                                       st.stride_a, &beta, c, ldc, st.stride_c,
                                       static_cast<int>(s.batch));
      if (r != HIPBLAS_STATUS_SUCCESS)
        throw Error("gemm_strided",
                    "hipBLAS GEMM failed with status " + std::to_string(static_cast<int>(r)));
      return;
    }
  }
#endif
  gemm_strided_kokkos(a, trans_a, b, trans_b, c, s, st);
}

/// C[b] = op(A[b]) * op(B[b]) for every batch b of contiguous row-major blocks; op transposes when
/// the flag says the operand is stored [k][m] (A) or [n][k] (B). Eigen when the host is built for
/// it, else gemm_strided (the vendor library, or the portable kernel).
template <class T>
void gemm_batched(const T* a, bool trans_a, const T* b, bool trans_b, T* c, const GemmShape& s) {
  constexpr GemmVendor vendor = gemm_vendor<Kokkos::DefaultExecutionSpace, T>();
#if defined(GSHARD_HOST_GEMM_EIGEN)
  if constexpr (vendor == GemmVendor::eigen) {
    if (s.batch == 0 || s.m == 0 || s.n == 0) return;
    flop_counters().add_contraction(2 * s.batch * s.m * s.n * s.k);
    return gemm_eigen(a, trans_a, b, trans_b, c, s);
  }
#endif
  (void)vendor;
  gemm_strided(a, trans_a, b, trans_b, c, s,
               GemmStrides{trans_a ? s.m : s.k, trans_b ? s.k : s.n, s.n, s.m * s.k, s.k * s.n,
                           s.m * s.n, 1.0, 0.0});
}

inline std::string only_in(const std::string& from, const std::string& in_a,
                           const std::string& not_in) {
  std::string s;
  for (char c : from)
    if (in_a.find(c) != std::string::npos && not_in.find(c) == std::string::npos) s += c;
  return s;
}

/// How contract() runs, computed from the labels and extents alone: the blocks left after summing
/// out labels only one operand has, the label groups and the batched GEMM's shape.
struct ContractPlan {
  LocalBlock a, b;             // after the sums; b empty for a unary einsum
  std::string batch, m, n, k;  // batch in output order; m, n, k in their operand's order
  GemmShape shape;
};

inline ContractPlan contract_plan(const LocalBlock& la, const LocalBlock* lb,
                                  const LocalBlock& lo) {
  ContractPlan p;
  if (lb == nullptr) {
    p.a = kept_block(la, lo.labels);
    const std::int64_t kept = p.a.size();
    p.shape = {1, lo.size(), 1, kept == 0 ? 0 : la.size() / std::max<std::int64_t>(1, kept)};
    return p;
  }
  p.a = kept_block(la, lb->labels + lo.labels);
  p.b = kept_block(*lb, la.labels + lo.labels);
  for (char c : lo.labels)
    if (p.a.labels.find(c) != std::string::npos && p.b.labels.find(c) != std::string::npos)
      p.batch += c;
  p.m = only_in(p.a.labels, lo.labels, p.b.labels);
  p.n = only_in(p.b.labels, lo.labels, p.a.labels);
  p.k = only_in(p.a.labels, p.b.labels, lo.labels);
  for (char c : p.batch) p.shape.batch *= p.a.extent(c);
  for (char c : p.m) p.shape.m *= p.a.extent(c);
  for (char c : p.n) p.shape.n *= p.b.extent(c);
  for (char c : p.k) p.shape.k *= p.a.extent(c);
  return p;
}

/// The batched GEMM shape contract() runs for these blocks (lb null for a unary einsum), without
/// running anything. For a unary einsum: m = output elements, k = elements summed into each.
inline GemmShape contract_shape(const LocalBlock& la, const LocalBlock* lb, const LocalBlock& lo) {
  return contract_plan(la, lb, lo).shape;
}

/// out = einsum of the local blocks (b may be null for a unary einsum). Returns the GEMM shape,
/// contract_shape()'s.
template <class T>
GemmShape contract(const T* a, const LocalBlock& la, const T* b, const LocalBlock& lb, T* out,
                   const LocalBlock& lo) {
  const ContractPlan p = contract_plan(la, b == nullptr ? nullptr : &lb, lo);
  KernelSpan span("kernel", "contract");
  if (span.on())
    span.set_detail(la.labels + (b == nullptr ? "" : "," + lb.labels) + "->" + lo.labels +
                    " (GEMM batch " + std::to_string(p.shape.batch) + ", m " +
                    std::to_string(p.shape.m) + ", n " + std::to_string(p.shape.n) + ", k " +
                    std::to_string(p.shape.k) + ")");
  // Labels only one operand has and the output drops: sum them out first.
  auto reduce = [](const T* data, const LocalBlock& l, const LocalBlock& kept,
                   Kokkos::View<T*>& storage) -> const T* {
    if (kept.labels.size() == l.labels.size()) return data;
    LocalBlock summed;
    storage = sum_out(data, l, kept.labels, summed);
    return storage.data();
  };
  Kokkos::View<T*> a_sum, b_sum, a_perm, b_perm, c_tmp;
  const LocalBlock& a2 = p.a;
  const LocalBlock& b2 = p.b;
  const T* a_red = reduce(a, la, a2, a_sum);
  if (b == nullptr) {
    permute_block(a_red, a2, out, lo.labels);
    return p.shape;
  }
  const T* b_red = reduce(b, lb, b2, b_sum);
  const std::string &batch = p.batch, &m = p.m, &n = p.n, &k = p.k;
  const GemmShape& s = p.shape;

  bool trans_a = false;
  const T* a_op = a_red;
  if (a2.labels == batch + k + m && !m.empty() && !k.empty()) {
    trans_a = true;
  } else if (a2.labels != batch + m + k) {
    a_perm = Kokkos::View<T*>(
        Kokkos::view_alloc(std::string("gshard::einsum::a"), Kokkos::WithoutInitializing),
        a2.size());
    permute_block(a_red, a2, a_perm.data(), batch + m + k);
    a_op = a_perm.data();
  }
  bool trans_b = false;
  const T* b_op = b_red;
  if (b2.labels == batch + n + k && !n.empty() && !k.empty()) {
    trans_b = true;
  } else if (b2.labels != batch + k + n) {
    b_perm = Kokkos::View<T*>(
        Kokkos::view_alloc(std::string("gshard::einsum::b"), Kokkos::WithoutInitializing),
        b2.size());
    permute_block(b_red, b2, b_perm.data(), batch + k + n);
    b_op = b_perm.data();
  }
  if (lo.labels == batch + m + n) {
    gemm_batched(a_op, trans_a, b_op, trans_b, out, s);
  } else if (lo.labels == batch + n + m) {
    // C^T = B^T A^T: swap the operands and flip their transposes.
    gemm_batched(b_op, !trans_b, a_op, !trans_a, out, GemmShape{s.batch, s.n, s.m, s.k});
  } else {
    c_tmp = Kokkos::View<T*>(
        Kokkos::view_alloc(std::string("gshard::einsum::c"), Kokkos::WithoutInitializing),
        s.batch * s.m * s.n);
    gemm_batched(a_op, trans_a, b_op, trans_b, c_tmp.data(), s);
    LocalBlock c_block{batch + m + n, {}};
    for (char c : c_block.labels) c_block.extents.push_back(lo.extent(c));
    permute_block(c_tmp.data(), c_block, out, lo.labels);
  }
  return s;
}

}  // namespace gshard::detail
