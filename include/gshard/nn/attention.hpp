#pragma once
// Fused scaled dot-product attention: softmax(q k / sqrt(D) + causal mask) v as one recorded op,
// per (batch, head) block on the local shard:
//
//   auto o = nn::scaled_dot_product_attention(q, k, v);   // q "B S N D", k and v "B T N D"
//
// Batch B and heads N may be split over any mesh axes (the work is local to each (b, n)); the
// sequence S, T and the head size D must not be. Each block's scores are one strided GEMM that
// reads the heads in place (no "B N S D" copy), the mask and softmax one pass per row, the
// weighted sum another strided GEMM writing straight into "B S N D". Causal attention runs in
// query blocks of 32 that read only the keys up to their block's end: the blocks above the
// diagonal are neither multiplied nor exponentiated (about half of them). The probabilities are
// kept for the backward pass (B N S T elements per call), which is four more strided GEMMs and
// one row pass. The composed einsum / softmax / einsum version computes the same; this one saves
// the permutes, the materialised mask sum and the separate reductions (docs/performance.md).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>

#include "../core/error.hpp"
#include "../expr/node.hpp"
#include "../kernels/attention.hpp"
#include "../kernels/contract.hpp"
#include "../tensor/graph.hpp"
#include "../tensor/sharded.hpp"
#include "diagnostics.hpp"

namespace gshard::nn {

struct AttentionOptions {
  bool causal = true;  // query s sees keys t <= s
  double scale = 0;    // 0: 1 / sqrt(D)
};

namespace detail {

/// What the backward pass reads: the operands' and probabilities' local blocks and their extents.
template <class T>
struct AttentionSaved {
  Kokkos::View<T*> q, k, v, p;
  std::int64_t b = 0, s = 0, t = 0, n = 0, d = 0;  // local B and N, whole S, T, D
  T scale = 1;
  bool causal = true;
};

/// One strided GEMM per local batch b over its n heads: C_bn = alpha op(A_bn) op(B_bn), where
/// operand X's block of (b, n) starts at x + b * xb + n * xn with rows ld_x apart.
template <class T>
void per_head_gemm(const AttentionSaved<T>& sv, const T* a, bool ta, std::int64_t ab,
                   std::int64_t an, std::int64_t lda, const T* b, bool tb, std::int64_t bb,
                   std::int64_t bn, std::int64_t ldb, T* c, std::int64_t cb, std::int64_t cn,
                   std::int64_t ldc, std::int64_t m, std::int64_t n, std::int64_t k, T alpha) {
  const gshard::detail::GemmShape shape{sv.n, m, n, k};
  const gshard::detail::GemmStrides st{lda, ldb, ldc, an, bn, cn, static_cast<double>(alpha), 0.0};
  for (std::int64_t i = 0; i < sv.b; ++i)
    gshard::detail::gemm_strided(a + i * ab, ta, b + i * bb, tb, c + i * cb, shape, st);
}

/// The query blocks [s0, s0 + m) of one call, each with the keys its rows read (causal: up to the
/// block's end, so the GEMMs skip the blocks above the diagonal), and the key blocks [t0, t0 + m)
/// with the first query that sees them (causal: t0).
template <class F>
void query_blocks(std::int64_t s, std::int64_t t, bool causal, F&& f) {
  const std::int64_t blk = causal ? gshard::detail::attention_block : s;
  for (std::int64_t s0 = 0; s0 < s; s0 += blk)
    f(s0, std::min(blk, s - s0), gshard::detail::attention_width(s0, t, causal));
}

template <class F>
void key_blocks(std::int64_t s, std::int64_t t, bool causal, F&& f) {
  const std::int64_t blk = causal ? gshard::detail::attention_block : t;
  for (std::int64_t t0 = 0; t0 < t; t0 += blk) {
    const std::int64_t first = causal ? t0 : 0;
    if (first < s) f(t0, std::min(blk, t - t0), first);
  }
}

template <class T>
Kokkos::View<T*> attention_forward(AttentionSaved<T>& sv) {
  const std::int64_t S = sv.s, Tn = sv.t, N = sv.n, D = sv.d;
  const std::int64_t rows = sv.b * N * S;
  sv.p = Kokkos::View<T*>(
      Kokkos::view_alloc("gshard::attention probabilities", Kokkos::WithoutInitializing),
      rows * Tn);
  Kokkos::View<T*> out(Kokkos::view_alloc("gshard::attention", Kokkos::WithoutInitializing),
                       sv.b * S * N * D);
  T* p = sv.p.data();
  // scores_bn [S][T] = scale q_bn k_bn^T; q_bn rows are N D apart in "B S N D".
  query_blocks(S, Tn, sv.causal, [&](std::int64_t s0, std::int64_t m, std::int64_t w) {
    per_head_gemm(sv, sv.q.data() + s0 * N * D, false, S * N * D, D, N * D, sv.k.data(), true,
                  Tn * N * D, D, N * D, p + s0 * Tn, N * S * Tn, S * Tn, Tn, m, w, D, sv.scale);
  });
  gshard::detail::attention_softmax_rows(sv.p, rows, S, Tn, sv.causal);
  // out_bn [S][D] = p_bn v_bn, written in place into "B S N D".
  query_blocks(S, Tn, sv.causal, [&](std::int64_t s0, std::int64_t m, std::int64_t w) {
    per_head_gemm(sv, p + s0 * Tn, false, N * S * Tn, S * Tn, Tn, sv.v.data(), false, Tn * N * D, D,
                  N * D, out.data() + s0 * N * D, S * N * D, D, N * D, m, D, w, static_cast<T>(1));
  });
  return out;
}

template <class T>
struct AttentionGrads {
  Kokkos::View<T*> q, k, v;
};

template <class T>
AttentionGrads<T> attention_backward(const AttentionSaved<T>& sv, const Kokkos::View<T*>& g) {
  const std::int64_t S = sv.s, Tn = sv.t, N = sv.n, D = sv.d;
  const std::int64_t rows = sv.b * N * S;
  auto fresh = [](const char* name, std::int64_t n) {
    return Kokkos::View<T*>(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing), n);
  };
  AttentionGrads<T> r{fresh("gshard::attention dq", sv.b * S * N * D),
                      fresh("gshard::attention dk", sv.b * Tn * N * D),
                      fresh("gshard::attention dv", sv.b * Tn * N * D)};
  if (sv.causal && Tn > S) {  // keys no query sees
    Kokkos::deep_copy(r.k, T{});
    Kokkos::deep_copy(r.v, T{});
  }
  const Kokkos::View<T*> ds = fresh("gshard::attention dscores", rows * Tn);
  const T one = 1;
  const T* p = sv.p.data();
  // dv_bn [T][D] = p_bn^T g_bn, over the queries that see each key block.
  key_blocks(S, Tn, sv.causal, [&](std::int64_t t0, std::int64_t m, std::int64_t first) {
    per_head_gemm(sv, p + first * Tn + t0, true, N * S * Tn, S * Tn, Tn, g.data() + first * N * D,
                  false, S * N * D, D, N * D, r.v.data() + t0 * N * D, Tn * N * D, D, N * D, m, D,
                  S - first, one);
  });
  // dp_bn [S][T] = g_bn v_bn^T, then the softmax's backward in place (with the scale).
  query_blocks(S, Tn, sv.causal, [&](std::int64_t s0, std::int64_t m, std::int64_t w) {
    per_head_gemm(sv, g.data() + s0 * N * D, false, S * N * D, D, N * D, sv.v.data(), true,
                  Tn * N * D, D, N * D, ds.data() + s0 * Tn, N * S * Tn, S * Tn, Tn, m, w, D, one);
  });
  gshard::detail::attention_softmax_grad_rows(ds, sv.p, rows, S, Tn, sv.causal, sv.scale);
  // dq_bn [S][D] = ds_bn k_bn; dk_bn [T][D] = ds_bn^T q_bn.
  query_blocks(S, Tn, sv.causal, [&](std::int64_t s0, std::int64_t m, std::int64_t w) {
    per_head_gemm(sv, ds.data() + s0 * Tn, false, N * S * Tn, S * Tn, Tn, sv.k.data(), false,
                  Tn * N * D, D, N * D, r.q.data() + s0 * N * D, S * N * D, D, N * D, m, D, w, one);
  });
  key_blocks(S, Tn, sv.causal, [&](std::int64_t t0, std::int64_t m, std::int64_t first) {
    per_head_gemm(sv, ds.data() + first * Tn + t0, true, N * S * Tn, S * Tn, Tn,
                  sv.q.data() + first * N * D, false, S * N * D, D, N * D, r.k.data() + t0 * N * D,
                  Tn * N * D, D, N * D, m, D, S - first, one);
  });
  return r;
}

/// q's layout with its S renamed (for k and v: the same splits of B and N).
constexpr Layout renamed(Layout l, char from, char to) {
  for (int i = 0; i < l.rank; ++i)
    if (l.dims[i].label == from) l.dims[i].label = to;
  return l;
}

template <class Q, class K, class V>
constexpr bool attention_ok() {
  using gshard::detail::shown;
  constexpr Layout q = Q::layout;
  if constexpr (!(q.rank == 4 && q.dims[0].label == 'B' && q.dims[1].label == 'S' &&
                  q.dims[2].label == 'N' && q.dims[3].label == 'D')) {
    return sizeof(nn_error::attention_operand_labels<shown<fixed_string("q")>, shown<Q::spec>,
                                                     shown<fixed_string("B S N D")>>) == 0;
  } else if constexpr (!(K::layout.rank == 4 && K::layout.dims[0].label == 'B' &&
                         K::layout.dims[1].label == 'T' && K::layout.dims[2].label == 'N' &&
                         K::layout.dims[3].label == 'D')) {
    return sizeof(nn_error::attention_operand_labels<shown<fixed_string("k")>, shown<K::spec>,
                                                     shown<fixed_string("B T N D")>>) == 0;
  } else if constexpr (!(V::layout.rank == 4 && V::layout.dims[0].label == 'B' &&
                         V::layout.dims[1].label == 'T' && V::layout.dims[2].label == 'N' &&
                         V::layout.dims[3].label == 'D')) {
    return sizeof(nn_error::attention_operand_labels<shown<fixed_string("v")>, shown<V::spec>,
                                                     shown<fixed_string("B T N D")>>) == 0;
  } else if constexpr (q.dims[1].split() || q.dims[3].split()) {
    return sizeof(nn_error::attention_sequence_or_head_size_split<shown<Q::spec>>) == 0;
  } else {
    return true;
  }
}

}  // namespace detail

/// softmax(q k^T scale + mask) v per batch and head: q "B S N D", k and v "B T N D" (k and v are
/// brought to q's splits of B and N: an implicit reshard where they differ), the result in q's
/// layout without pending sums. B and N may be split over any axes; S, T and D may not (a
/// compile-time error names the operand). Causal by default: query s sees keys t <= s.
template <Expression Q, Expression K, Expression V>
auto scaled_dot_product_attention(const Q& q, const K& k, const V& v, AttentionOptions o = {},
                                  std::source_location where = std::source_location::current()) {
  const gshard::detail::UserSite site(where, "scaled_dot_product_attention");
  if constexpr (!detail::attention_ok<Q, K, V>()) {
    return 0;
  } else {
    using T = typename Q::value_type;
    using MeshT = typename Q::mesh_type;
    static_assert(std::is_same_v<typename K::value_type, T> &&
                      std::is_same_v<typename V::value_type, T> &&
                      std::is_same_v<typename K::mesh_type, MeshT> &&
                      std::is_same_v<typename V::mesh_type, MeshT>,
                  "gshard::nn::scaled_dot_product_attention: q, k and v must have one element "
                  "type and one Mesh type");
    static_assert(std::is_floating_point_v<T>,
                  "gshard::nn::scaled_dot_product_attention: float or double elements");
    constexpr Layout ql = gshard::detail::finished_layout(Q::layout);
    constexpr Layout kl = detail::renamed(ql, 'S', 'T');
    static_assert(
        gshard::detail::strict_check<MeshT, "scaled_dot_product_attention", 1, K::layout, kl>());
    static_assert(
        gshard::detail::strict_check<MeshT, "scaled_dot_product_attention", 2, V::layout, kl>());
    using R = Sharded<T, MeshT, gshard::detail::spec_of<MeshT, ql>()>;
    const std::string op = "scaled_dot_product_attention";
    const auto qr = gshard::detail::materialise_as(q, ql, op);
    const auto kr = gshard::detail::materialise_as(k, kl, op);
    const auto vr = gshard::detail::materialise_as(v, kl, op);
    const Shape qs = qr.shape, ks = kr.shape, vs = vr.shape;
    if (ks != vs || ks[0] != qs[0] || ks[2] != qs[2] || ks[3] != qs[3])
      throw Error(op, "q " + gshard::detail::shape_string(qs) + ", k " +
                          gshard::detail::shape_string(ks) + " and v " +
                          gshard::detail::shape_string(vs) +
                          " must agree on B, N and D, and k and v on T");
    const auto& mesh = q.mesh();
    const Shape local =
        gshard::detail::local_extents(ql, qs, gshard::detail::mesh_state(mesh).sizes);
    auto sv = std::make_shared<detail::AttentionSaved<T>>();
    sv->q = qr.data, sv->k = kr.data, sv->v = vr.data;
    sv->b = local[0], sv->s = qs[1], sv->t = ks[1], sv->n = local[2], sv->d = qs[3];
    sv->causal = o.causal;
    sv->scale =
        static_cast<T>(o.scale != 0 ? o.scale : 1.0 / std::sqrt(static_cast<double>(qs[3])));
    gshard::detail::RuntimeTensor<T> out(ql, qs, detail::attention_forward(*sv));
    gshard::detail::record(
        mesh, out, op, std::source_location{}, {qr.grad, kr.grad, vr.grad},
        [sv, ql, kl, qs, ks](const gshard::detail::RuntimeTensor<T>& g) {
          const detail::AttentionGrads<T> d = detail::attention_backward(*sv, g.data);
          using RT = gshard::detail::RuntimeTensor<T>;
          using gshard::detail::AnyTensor;
          const Layout lq = gshard::detail::with_pending(ql, g.layout);
          const Layout lk = gshard::detail::with_pending(kl, g.layout);
          return gshard::detail::Cotangents{AnyTensor(RT(lq, qs, d.q)), AnyTensor(RT(lk, ks, d.k)),
                                            AnyTensor(RT(lk, ks, d.v))};
        });
    return gshard::detail::sharded_from<R>(mesh, out);
  }
}

}  // namespace gshard::nn
