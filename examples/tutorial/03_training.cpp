// Tutorial, step 3 (docs/tutorial.md): training. A small model (an MoE layer and a sharded
// linear read-out) learns to imitate a fixed "teacher" map with AdamW: parameters are tracked,
// grad() runs the backward pass (its collectives are the forward's, transposed), the optimizer
// updates each shard in place. Then a checkpoint is saved and read back onto another mesh, and
// one step is traced. Checks: the loss falls below a quarter of its start, the checkpoint reads
// back bit for bit, and the step plan holds the backward pass.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <gshard/gshard.hpp>
#include <string>
#include <tuple>
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

  using Tokens = gs::Sharded<float, Mesh, "G:data*expert S M">;
  using Router = gs::Sharded<float, Mesh, "M E">;
  using In = gs::Sharded<float, Mesh, "E:expert M H">;
  using Out = gs::Sharded<float, Mesh, "E:expert H M">;
  using Readout = gs::Sharded<float, Mesh, "M N">;
  using Targets = gs::Sharded<float, Mesh, "G:data*expert S N">;
  const std::int64_t groups = 2 * ranks, tokens = 32, model = 16, hidden = 32, experts = 4;
  // [setup]

  // [model]
  Router wg = gs::random_normal<Router>(mesh, {model, experts}, 1, 0.0f, 0.1f);
  In wi = gs::random_normal<In>(mesh, {experts, model, hidden}, 2, 0.0f, 0.25f);
  Out wo = gs::random_normal<Out>(mesh, {experts, hidden, model}, 3, 0.0f, 0.18f);
  Readout wr = gs::random_normal<Readout>(mesh, {model, model}, 4, 0.0f, 0.25f);
  gs::nn::MoeOptions moe;
  moe.capacity_factor = 4;  // room for every token: nothing is dropped
  auto forward = [&](const Tokens& x, std::uint64_t step) {
    moe.seed = step;  // the second expert's random choice varies per step
    const auto r = gs::nn::moe(x, wg, wi, wo, moe);
    return gs::einsum<"GSM,MN->GSN">(x + r.output, wr);  // a residual, then the read-out
  };
  // [model]

  // [data]
  // The teacher: a fixed random map; each step a fresh batch of inputs and the teacher's outputs.
  const Readout teacher = gs::random_normal<Readout>(mesh, {model, model}, 99, 0.0f, 0.25f);
  auto batch = [&](std::uint64_t step) {
    const Tokens x = gs::random_normal<Tokens>(mesh, {groups, tokens, model}, 1000 + step);
    const Targets y = gs::tanh(gs::einsum<"GSM,MN->GSN">(x, teacher));
    return std::pair{x, y};
  };
  // [data]

  // [train]
  gs::nn::AdamW optimizer(gs::nn::AdamWOptions{.learning_rate = 1e-2});
  auto train_step = [&](std::uint64_t step) {
    const auto [x, y] = batch(step);
    gs::track(std::tie(wg, wi, wo, wr));
    const auto d = forward(x, step) - y;
    const auto loss = gs::mean<"GSN">(d * d);  // a scalar, pending over G's axes: no collective
    static_assert(decltype(loss)::spec_string() == "+data +expert");
    auto [gg, gi, go, gr] = gs::grad(loss, std::tie(wg, wi, wo, wr));
    gs::untrack(std::tie(wg, wi, wo, wr));
    gs::nn::clip_by_global_norm(std::tie(gg, gi, go, gr), 1.0);
    optimizer.step(std::tie(wg, wi, wo, wr), std::tie(gg, gi, go, gr));
    return double(loss.to_global()[0]);
  };
  double first = 0, last = 0;
  for (std::uint64_t step = 0; step < 60; ++step) {
    last = train_step(step);
    if (step == 0) first = last;
    if (mesh.rank() == 0 && step % 10 == 0) std::printf("step %3d  loss %.5f\n", int(step), last);
  }
  // [train]

  // [checkpoint]
  const std::string path = "tutorial_03.safetensors";
  gs::io::SafetensorsWriter writer(mesh.comm());
  writer.add("wi", wi);
  writer.add("wr", wr);
  optimizer.save(writer, std::tie(wg, wi, wo, wr));
  writer.write(path);  // collective, atomic; each rank writes its own block
  // Read back onto another mesh: one axis of every rank, the experts split over all of them.
  using Line = gs::Mesh<"all">;
  const Line line(MPI_COMM_WORLD, {ranks});
  gs::io::SafetensorsReader reader(line.comm(), path);
  const auto wi_line = reader.read<gs::Sharded<float, Line, "E:all M H">>(line, "wi");
  // [checkpoint]
  const bool same = wi_line.to_global() == wi.to_global();

  // [trace]
  const gs::StepPlan plan = gs::explain_step(mesh, [&](int) { train_step(60); });
  if (mesh.rank() == 0) std::printf("%s", plan.text(8).c_str());
  // [trace]
  bool backward = false;
  for (const auto& op : plan.ops) backward = backward || op.op.starts_with("grad of ");

  const bool ok = last < 0.25 * first && same && backward;
  if (mesh.rank() == 0) {
    std::filesystem::remove(path);
    std::printf("tutorial 3: loss %.5f -> %.5f on %s; checkpoint read back %s: %s\n", first, last,
                mesh.describe().c_str(), same ? "equal" : "DIFFERENT", ok ? "ok" : "WRONG");
  }
  return ok ? 0 : 1;
}
