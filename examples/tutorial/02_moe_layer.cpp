// Tutorial, step 2 (docs/tutorial.md): a Mixture-of-Experts layer with the experts spread over
// ranks. Tokens in groups "G S M" split over every rank, experts "E" split over the "expert" axis:
// the layer routes each token to its top-2 experts, and two AllToAlls carry the tokens to their
// experts and back. Checked against GShard's dense formulation (one-hot dispatch and combine
// einsums) of the same layer, and the step plan shows the AllToAlls.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <gshard/gshard.hpp>
#include <vector>

namespace gs = gshard;

int main(int argc, char** argv) {
  // [setup]
  gs::Environment env(argc, argv);
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  using Mesh = gs::Mesh<"data", "expert">;
  const int data = ranks % 2 == 0 ? ranks / 2 : ranks;
  const Mesh mesh(MPI_COMM_WORLD, {data, ranks / data});
  // [setup]

  // [layer]
  using Tokens = gs::Sharded<float, Mesh, "G:data*expert S M">;  // groups over every rank
  using Router = gs::Sharded<float, Mesh, "M E">;                // replicated
  using In = gs::Sharded<float, Mesh, "E:expert M H">;           // experts over "expert"
  using Out = gs::Sharded<float, Mesh, "E:expert H M">;
  const std::int64_t groups = 2 * ranks, tokens = 64, model = 32, hidden = 64, experts = 8;
  const Tokens x = gs::random_normal<Tokens>(mesh, {groups, tokens, model}, /*seed=*/1);
  const Router wg = gs::random_normal<Router>(mesh, {model, experts}, 2, 0.0f, 0.2f);
  const In wi = gs::random_normal<In>(mesh, {experts, model, hidden}, 3, 0.0f, 0.2f);
  const Out wo = gs::random_normal<Out>(mesh, {experts, hidden, model}, 4, 0.0f, 0.2f);
  gs::nn::MoeOptions options;  // top-2 routing, capacity factor 2
  const auto r = gs::nn::moe(x, wg, wi, wo, options);
  static_assert(std::is_same_v<std::decay_t<decltype(r.output)>, Tokens>);  // x's layout
  // [layer]

  // [plan]
  const gs::StepPlan plan =
      gs::explain_step(mesh, [&](int) { (void)gs::nn::moe(x, wg, wi, wo, options); });
  if (mesh.rank() == 0) std::printf("%s", plan.text(5).c_str());
  // [plan]

  // The reference: the dense dispatch/combine einsums of the GShard paper, same routing.
  gs::nn::MoeOptions dense = options;
  dense.dense = true;
  const auto ref = gs::nn::moe(x, wg, wi, wo, dense);
  const std::vector<float> got = r.output.to_global(), want = ref.output.to_global();
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    err = std::max(err, double(std::abs(got[i] - want[i])));
    scale = std::max(scale, double(std::abs(want[i])));
  }
  // With more than one expert rank, the tokens travel by AllToAll over "expert".
  bool all_to_all = mesh.axis_size(1) == 1;
  for (const auto& c : plan.collectives)
    if (c.kind == "AllToAll" && c.axes == "expert") all_to_all = true;
  const bool ok = err <= 1e-5 * std::max(scale, 1.0) && scale > 0 && all_to_all;
  const double aux = r.aux_loss.to_global()[0];  // collective: every rank calls it
  if (mesh.rank() == 0) {
    std::printf("tokens per expert:");
    for (const auto n : r.tokens_per_expert) std::printf(" %lld", static_cast<long long>(n));
    std::printf(
        "\ntutorial 2: MoE layer on %s, capacity %lld, dropped %.3f, aux loss %.3f: "
        "max difference from the dense layer %.3g: %s\n",
        mesh.describe().c_str(), static_cast<long long>(r.capacity), r.dropped_fraction, aux, err,
        ok ? "ok" : "WRONG");
  }
  return ok ? 0 : 1;
}
