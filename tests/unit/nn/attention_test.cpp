// nn::scaled_dot_product_attention (nn/attention.hpp): values and the gradients of q, k and v
// against the composed einsum / mask / softmax / einsum on one rank's global values (an
// independent path through ops already tested), on every mesh with B and N split (unevenly), on
// the vendor GEMM and on the portable kernel, causal and not; bad shapes are one Error on every
// rank; no communication when nothing needs it.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/autodiff/grad.hpp>
#include <gshard/nn/attention.hpp>
#include <gshard/nn/transformer.hpp>
#include <gshard/ops/einsum.hpp>
#include <gshard/ops/elementwise.hpp>
#include <gshard/ops/normalize.hpp>
#include <gshard/ops/reduce.hpp>
// clang-format on

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "errors.hpp"
#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gshard::test::make;
using gshard::test::same_error_everywhere;

double max_abs(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

struct Result {
  std::vector<double> out, dq, dk, dv;
};

// loss = sum(o * r): its gradients carry r through the op.
template <class Q, class KV, class F>
Result run(const Q& q0, const KV& k0, const KV& v0, const Q& r, F attend) {
  Q q = q0;
  KV k = k0, v = v0;
  gs::track(std::tie(q, k, v));
  const Q o = attend(q, k, v);
  const auto loss = gs::sum<"BSND">(o * r);
  auto g = gs::grad(loss, std::tie(q, k, v));
  gs::untrack(std::tie(q, k, v));
  const auto d = [](const auto& x) { return std::vector<double>(x.begin(), x.end()); };
  return {d(o.to_global()), d(std::get<0>(g).to_global()), d(std::get<1>(g).to_global()),
          d(std::get<2>(g).to_global())};
}

// The reference, in double: einsums, the additive causal mask (query s sees keys t <= s) and
// softmax, as nn::causal_attention does.
template <class MeshT, class E>
Result composed(const MeshT& self, const std::vector<E>& qv, const std::vector<E>& kv,
                const std::vector<E>& vv, const std::vector<E>& rv, gs::Shape qs, gs::Shape ks,
                bool causal, double scale) {
  using Q = gs::Sharded<double, MeshT, "B S N D">;
  using KV = gs::Sharded<double, MeshT, "B T N D">;
  using Mask = gs::Sharded<double, MeshT, "S T">;
  std::vector<double> mv(static_cast<std::size_t>(qs[1] * ks[1]), 0.0);
  for (std::int64_t i = 0; i < qs[1]; ++i)
    for (std::int64_t t = i + 1; causal && t < ks[1]; ++t)
      mv[static_cast<std::size_t>(i * ks[1] + t)] = -std::numeric_limits<double>::infinity();
  const Mask mask = gs::from_global<Mask>(self, {qs[1], ks[1]}, mv);
  const auto d = [](const std::vector<E>& x) { return std::vector<double>(x.begin(), x.end()); };
  return run(gs::from_global<Q>(self, qs, d(qv)), gs::from_global<KV>(self, ks, d(kv)),
             gs::from_global<KV>(self, ks, d(vv)), gs::from_global<Q>(self, qs, d(rv)),
             [&](const Q& q, const KV& k, const KV& v) {
               const auto s = (gs::einsum<"BSND,BTND->BNST">(q, k) * scale + mask).eval();
               const auto p = gs::softmax<"T">(s);
               return Q(gs::einsum<"BNST,BTND->BSND">(p, v));
             });
}

struct Sizes {
  std::int64_t b = 3, s = 6, t = 6, n = 3, d = 4;
};

template <gs::fixed_string QSpec, gs::fixed_string KSpec, class E = double, class MeshT>
void attention_case(const MeshT& mesh, bool causal, bool portable, bool same_splits = true,
                    Sizes z = {}) {
  using Self = gs::Mesh<"x", "y">;
  const Self self(MPI_COMM_SELF, {1, 1});
  using Q = gs::Sharded<E, MeshT, QSpec>;
  using KV = gs::Sharded<E, MeshT, KSpec>;
  const std::int64_t D = z.d;
  const gs::Shape qs{z.b, z.s, z.n, D}, ks{z.b, z.t, z.n, D};
  const Q q = make<Q>(mesh, qs, 1), r = make<Q>(mesh, qs, 4);
  const KV k = make<KV>(mesh, ks, 2), v = make<KV>(mesh, ks, 3);
  const double scale = causal ? 1.0 / std::sqrt(static_cast<double>(D)) : 0.7;
  gs::detail::portable_gemm_forced() = portable;
  // Nothing to communicate where k and v have q's splits: the work is local to each (b, n).
  gs::comm_counters().reset();
  (void)gs::nn::scaled_dot_product_attention(q, k, v, {.causal = causal});
  if (same_splits) CHECK(gs::comm_counters().total().calls == 0);
  const Result got = run(q, k, v, r, [&](const Q& a, const KV& b, const KV& c) {
    return gs::nn::scaled_dot_product_attention(a, b, c,
                                                {.causal = causal, .scale = causal ? 0 : scale});
  });
  gs::detail::portable_gemm_forced() = false;
  const Result want = composed(self, q.to_global(), k.to_global(), v.to_global(), r.to_global(), qs,
                               ks, causal, scale);
  // float: the probabilities' exponential is a polynomial within 2 ulp of expf.
  const double tol = std::is_same_v<E, double> ? 1e-12 : 2e-5;
  CHECK(max_abs(got.out, want.out) < tol);
  CHECK(max_abs(got.dq, want.dq) < tol);
  CHECK(max_abs(got.dk, want.dk) < tol);
  CHECK(max_abs(got.dv, want.dv) < tol);
}

}  // namespace

TEST_CASE("scaled_dot_product_attention equals the composed einsums on every mesh") {
  using M2 = gs::Mesh<"x", "y">;
  for (const auto& s : gshard::test::listed_mesh_shapes(gshard::test::world_size())) {
    if (s.size() != 2) continue;
    const M2 mesh(MPI_COMM_WORLD, {s[0], s[1]});
    for (const bool causal : {true, false})
      for (const bool portable : {false, true}) {
        INFO("mesh " << gshard::test::sizes_text(s) << ", causal " << causal << ", portable "
                     << portable);
        attention_case<"B:x S N:y D", "B:x T N:y D">(mesh, causal, portable);
        attention_case<"B S N:x*y D", "B T N:x*y D">(mesh, causal, portable);
        attention_case<"B:y S N D", "B:y T N D">(mesh, causal, portable);
        // k and v split otherwise: brought to q's splits first.
        attention_case<"B:x S N:y D", "B T:y N D">(mesh, causal, portable, false);
      }
  }
}

TEST_CASE("causal attention in query blocks: several blocks, uneven, T != S, float and double") {
  using M2 = gs::Mesh<"x", "y">;
  for (const auto& s : gshard::test::listed_mesh_shapes(gshard::test::world_size())) {
    if (s.size() != 2) continue;
    const M2 mesh(MPI_COMM_WORLD, {s[0], s[1]});
    // 32-query blocks: three with the last one short, one, and keys beyond or short of the queries.
    for (const Sizes z : {Sizes{2, 70, 70, 3, 8}, Sizes{2, 33, 33, 2, 5}, Sizes{1, 40, 100, 2, 4},
                          Sizes{2, 70, 45, 1, 4}})
      for (const bool portable : {false, true}) {
        INFO("mesh " << gshard::test::sizes_text(s) << ", S " << z.s << ", T " << z.t
                     << ", portable " << portable);
        attention_case<"B:x S N:y D", "B:x T N:y D">(mesh, true, portable, true, z);
        attention_case<"B:x S N:y D", "B:x T N:y D", float>(mesh, true, portable, true, z);
        attention_case<"B:x S N:y D", "B:x T N:y D", float>(mesh, false, portable, true, z);
      }
  }
}

TEST_CASE("exp_shifted: within 2 ulp of std::exp over the softmax's range, tiny below -87") {
  std::vector<float> x(200001), got;
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = 5.0f - 105.0f * static_cast<float>(i) / static_cast<float>(x.size() - 1);
  got = x;
  gs::detail::exp_shifted(got.data(), static_cast<std::int64_t>(got.size()), 5.0f);
  double worst_ulps = 0;
  int large_below = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const float shifted = x[i] - 5.0f;
    const double want = std::exp(static_cast<double>(shifted));
    if (shifted < -87.0f) {
      large_below += got[i] > 2e-38f;
    } else {
      const float w = static_cast<float>(want);
      const double ulp = static_cast<double>(std::nextafter(w, 1.0f) - w);
      worst_ulps = std::max(worst_ulps, std::abs(static_cast<double>(got[i]) - want) / ulp);
    }
  }
  CHECK(worst_ulps <= 2.0);
  CHECK(large_below == 0);
  CHECK(gs::detail::exp_nonpositive(0.0f) == 1.0f);
  float nan = std::nanf("");
  gs::detail::exp_shifted(&nan, 1, 0.0f);
  CHECK(std::isnan(nan));
}

TEST_CASE("scaled_dot_product_attention: shapes that disagree are one Error on every rank") {
  using M2 = gs::Mesh<"x", "y">;
  const M2 mesh(MPI_COMM_WORLD, {gshard::test::world_size(), 1});
  using Q = gs::Sharded<double, M2, "B:x S N D">;
  using KV = gs::Sharded<double, M2, "B:x T N D">;
  const Q q = make<Q>(mesh, {2, 4, 2, 3}, 1);
  const KV k = make<KV>(mesh, {2, 4, 2, 5}, 2);
  const KV v = make<KV>(mesh, {2, 4, 2, 3}, 3);
  same_error_everywhere([&] { (void)gs::nn::scaled_dot_product_attention(q, k, v); },
                        "gshard::scaled_dot_product_attention: q [2, 4, 2, 3], k [2, 4, 2, 5]");
}
