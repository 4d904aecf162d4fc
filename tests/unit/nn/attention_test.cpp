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
#include <string>
#include <tuple>
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
  return {o.to_global(), std::get<0>(g).to_global(), std::get<1>(g).to_global(),
          std::get<2>(g).to_global()};
}

// The reference: einsums, the additive causal mask and softmax, as nn::causal_attention does.
template <class MeshT>
Result composed(const MeshT& self, const std::vector<double>& qv, const std::vector<double>& kv,
                const std::vector<double>& vv, const std::vector<double>& rv, gs::Shape qs,
                gs::Shape ks, bool causal, double scale) {
  using Q = gs::Sharded<double, MeshT, "B S N D">;
  using KV = gs::Sharded<double, MeshT, "B T N D">;
  using Mask = gs::Sharded<double, MeshT, "S T">;
  const Mask mask =
      causal ? gs::nn::causal_mask<Mask>(self, qs[1]) : gs::zeros<Mask>(self, {qs[1], ks[1]});
  return run(gs::from_global<Q>(self, qs, qv), gs::from_global<KV>(self, ks, kv),
             gs::from_global<KV>(self, ks, vv), gs::from_global<Q>(self, qs, rv),
             [&](const Q& q, const KV& k, const KV& v) {
               const auto s = (gs::einsum<"BSND,BTND->BNST">(q, k) * scale + mask).eval();
               const auto p = gs::softmax<"T">(s);
               return Q(gs::einsum<"BNST,BTND->BSND">(p, v));
             });
}

template <gs::fixed_string QSpec, gs::fixed_string KSpec, class MeshT>
void attention_case(const MeshT& mesh, bool causal, bool portable, bool same_splits = true) {
  using Self = gs::Mesh<"x", "y">;
  const Self self(MPI_COMM_SELF, {1, 1});
  using Q = gs::Sharded<double, MeshT, QSpec>;
  using KV = gs::Sharded<double, MeshT, KSpec>;
  const std::int64_t B = 3, S = 6, N = 3, D = 4;
  const gs::Shape qs{B, S, N, D}, ks{B, S, N, D};
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
  CHECK(max_abs(got.out, want.out) < 1e-12);
  CHECK(max_abs(got.dq, want.dq) < 1e-12);
  CHECK(max_abs(got.dk, want.dk) < 1e-12);
  CHECK(max_abs(got.dv, want.dv) < 1e-12);
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
