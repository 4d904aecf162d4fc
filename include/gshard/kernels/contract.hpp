#pragma once
// The local part of an einsum: contract two row-major blocks given their labels, as batched GEMM.
// Labels only in one operand and not in the output are summed first; then each operand is viewed
// as [batch, m, k] / [batch, k, n] (or their transposes), copying only when the labels are not
// already grouped that way; the product lands in the output directly when its order allows.
#include <Eigen/Core>
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "copy_box.hpp"

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

/// Sums `in` over the labels not in `keep` (keeping their order).
template <class T>
Kokkos::View<T*> sum_out(const T* in, const LocalBlock& from, const std::string& keep,
                         LocalBlock& to) {
  to.labels.clear();
  to.extents.clear();
  std::int64_t stride[max_dims];
  row_major_strides(static_cast<int>(from.labels.size()), from.extents.data(), stride);
  struct Plan {
    int kept = 0, summed = 0;
    std::int64_t kept_ext[max_dims]{}, kept_stride[max_dims]{};
    std::int64_t sum_ext[max_dims]{}, sum_stride[max_dims]{};
  } p;
  for (std::size_t d = 0; d < from.labels.size(); ++d) {
    if (keep.find(from.labels[d]) != std::string::npos) {
      to.labels += from.labels[d];
      to.extents.push_back(from.extents[d]);
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

inline constexpr bool host_gemm =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace,
                               Kokkos::DefaultExecutionSpace::memory_space>::accessible;

/// C[b] = op(A[b]) * op(B[b]) for every batch b; op transposes when the flag says the operand is
/// stored [k][m] (A) or [n][k] (B). Row-major throughout.
template <class T>
void gemm_batched(const T* a, bool trans_a, const T* b, bool trans_b, T* c, const GemmShape& s) {
  if (s.batch == 0 || s.m == 0 || s.n == 0) return;
  if constexpr (host_gemm) {
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
  } else {
    // Portable fallback for device memory spaces: one thread per output element.
    const GemmShape sh = s;
    Kokkos::parallel_for(
        "gshard::einsum::gemm", Kokkos::RangePolicy<>(0, s.batch * s.m * s.n),
        KOKKOS_LAMBDA(std::int64_t idx) {
          const std::int64_t j = idx % sh.n;
          const std::int64_t i = (idx / sh.n) % sh.m;
          const std::int64_t bb = idx / (sh.n * sh.m);
          const T* ab = a + bb * sh.m * sh.k;
          const T* bbp = b + bb * sh.k * sh.n;
          T acc{};
          for (std::int64_t k = 0; k < sh.k; ++k)
            acc += (trans_a ? ab[k * sh.m + i] : ab[i * sh.k + k]) *
                   (trans_b ? bbp[j * sh.k + k] : bbp[k * sh.n + j]);
          c[idx] = acc;
        });
  }
}

inline std::string only_in(const std::string& from, const std::string& in_a,
                           const std::string& not_in) {
  std::string s;
  for (char c : from)
    if (in_a.find(c) != std::string::npos && not_in.find(c) == std::string::npos) s += c;
  return s;
}

/// out = einsum of the local blocks (b may be null for a unary einsum). Returns the GEMM shape.
template <class T>
GemmShape contract(const T* a, const LocalBlock& la, const T* b, const LocalBlock& lb, T* out,
                   const LocalBlock& lo) {
  // Labels only one operand has and the output drops: sum them out first.
  auto reduce = [&](const T* data, const LocalBlock& l, const std::string& keep, LocalBlock& kept,
                    Kokkos::View<T*>& storage) -> const T* {
    bool all = true;
    for (char c : l.labels)
      if (keep.find(c) == std::string::npos) all = false;
    if (all) {
      kept = l;
      return data;
    }
    storage = sum_out(data, l, keep, kept);
    return storage.data();
  };
  Kokkos::View<T*> a_sum, b_sum, a_perm, b_perm, c_tmp;
  LocalBlock a2, b2;
  if (b == nullptr) {
    const T* a_red = reduce(a, la, lo.labels, a2, a_sum);
    permute_block(a_red, a2, out, lo.labels);
    return {1, lo.size(), 1, a2.size() == 0 ? 0 : la.size() / std::max<std::int64_t>(1, a2.size())};
  }
  const T* a_red = reduce(a, la, lb.labels + lo.labels, a2, a_sum);
  const T* b_red = reduce(b, lb, la.labels + lo.labels, b2, b_sum);

  std::string batch;  // in both operands and the output, in output order
  for (char c : lo.labels)
    if (a2.labels.find(c) != std::string::npos && b2.labels.find(c) != std::string::npos)
      batch += c;
  const std::string m = only_in(a2.labels, lo.labels, b2.labels);
  const std::string n = only_in(b2.labels, lo.labels, a2.labels);
  const std::string k = only_in(a2.labels, b2.labels, lo.labels);
  GemmShape s;
  for (char c : batch) s.batch *= a2.extent(c);
  for (char c : m) s.m *= a2.extent(c);
  for (char c : n) s.n *= b2.extent(c);
  for (char c : k) s.k *= a2.extent(c);

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
