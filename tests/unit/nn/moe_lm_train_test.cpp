// The main job's training loop (examples/moe_lm/train.hpp) on the installed fortune corpus:
// - the same seed and mesh give a bitwise identical loss sequence in two runs, and every listed
//   mesh (data x expert [x model], uneven batch blocks) the sequence of one rank within 1e-4 over
//   20 steps;
// - weak scaling (run on 16 ranks by its own CTest entry): with experts and ranks growing together
//   from 2 to 16, per-rank peak memory and AllToAll payload per step stay within 5% (counters).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "mpi_test.hpp"
#include "op_checks.hpp"
#include "scratch_files.hpp"

#include <gshard/kernels/memory.hpp>

#include "../../../examples/moe_lm/train.hpp"

namespace {

using gshard::test::listed_mesh_shapes;
using gshard::test::sizes_text;
using gshard::test::world_rank;
using gshard::test::world_size;

const moe_lm::Corpus& corpus() {
  static const moe_lm::Corpus c = moe_lm::load_corpus();
  return c;
}

// A small model with the main job's structure: 2 blocks (one MoE), 4 experts, top-2.
moe_lm::Options small_options() {
  moe_lm::Options o;
  o.d_model = 32;
  o.layers = 2;
  o.heads = 2;
  o.ffn = 64;
  o.experts = 4;
  o.context = 24;
  o.batch = 6;  // uneven over 4 and 8 ranks: some ranks hold no rows
  o.steps = 20;
  o.warmup = 4;
  o.lr = 3e-3;
  o.seed = 7;
  return o;
}

std::vector<double> losses(const moe_lm::MeshT& mesh, const moe_lm::Options& o) {
  moe_lm::Trainer t(mesh, o);
  std::vector<double> out;
  for (std::int64_t s = 0; s < o.steps; ++s) out.push_back(t.step(corpus(), s).loss);
  return out;
}

}  // namespace

TEST_CASE("moe_lm: bitwise repeatable per mesh, within 1e-4 of one rank on every mesh") {
  const moe_lm::Options o = small_options();
  const auto reference = losses(moe_lm::make_mesh({1, 1}, MPI_COMM_SELF), o);
  REQUIRE(reference.size() == 20);
  CHECK(reference.back() < reference.front() - 0.5);  // it trains
  for (const auto& shape : listed_mesh_shapes(world_size())) {
    INFO("mesh data x expert [x model] " << sizes_text(shape));
    const auto mesh = moe_lm::make_mesh(shape);
    const auto first = losses(mesh, o);
    const auto second = losses(mesh, o);
    REQUIRE(first.size() == reference.size());
    CHECK(std::memcmp(first.data(), second.data(), first.size() * sizeof(double)) == 0);
    double worst = 0;
    for (std::size_t i = 0; i < first.size(); ++i)
      worst = std::max(worst, std::abs(first[i] - reference[i]));
    if (world_rank() == 0)
      MESSAGE("mesh " << sizes_text(shape) << ": largest difference from one rank " << worst);
    CHECK(worst <= 1e-4);
  }
}

TEST_CASE(
    "moe_lm: dropless routing balanced by the selection bias: repeatable, mesh-independent, "
    "resumed bitwise from a checkpoint that holds the bias") {
  moe_lm::Options o = small_options();
  o.routing = "dropless";
  o.balance = "bias";
  o.bias_rate = 0.01;
  o.steps = 12;
  const auto reference = losses(moe_lm::make_mesh({1, 1}, MPI_COMM_SELF), o);
  CHECK(reference.back() < reference.front() - 0.3);  // it trains
  const auto dir = gshard::test::scratch_dir("moe_lm_bias");
  for (const auto& shape : listed_mesh_shapes(world_size())) {
    INFO("mesh data x expert [x model] " << sizes_text(shape));
    const auto mesh = moe_lm::make_mesh(shape);
    moe_lm::Trainer t(mesh, o);
    std::vector<double> run;
    for (std::int64_t s = 0; s < 6; ++s) run.push_back(t.step(corpus(), s).loss);
    const std::string path = (dir / ("ckpt_" + sizes_text(shape) + ".safetensors")).string();
    t.save(path, 6, {});
    const auto bias = t.model().selection_bias;
    REQUIRE(bias.size() == 1);  // one MoE block
    REQUIRE(bias[0].size() == 4);
    CHECK(std::any_of(bias[0].begin(), bias[0].end(), [](double b) { return b != 0; }));
    for (std::int64_t s = 6; s < o.steps; ++s) run.push_back(t.step(corpus(), s).loss);
    double worst = 0;
    for (std::size_t i = 0; i < run.size(); ++i)
      worst = std::max(worst, std::abs(run[i] - reference[i]));
    CHECK(worst <= 1e-4);
    // A fresh trainer resumed from the checkpoint: the same bias, the same losses bit for bit.
    moe_lm::Trainer resumed(mesh, o);
    const gshard::io::SafetensorsReader reader(mesh.comm(), path);
    CHECK(reader.contains("router.selection_bias"));
    CHECK(resumed.load(reader) == 6);
    CHECK(resumed.model().selection_bias == bias);
    for (std::int64_t s = 6; s < o.steps; ++s)
      CHECK(resumed.step(corpus(), s).loss == run[static_cast<std::size_t>(s)]);
  }
  gshard::test::cleanup(dir);
}

// Weak scaling: n ranks on a 1 x n mesh (data 1, expert n), n experts (one per rank), 2 rows of
// 64 tokens per rank. Per rank, expert weights, activations and the dispatched tokens stay the
// same size; the router ("M E") and its logits grow with E, kept small against the rest here.
// AllToAll counters hold the bytes a rank sends to others, (n-1)/n of its payload; the payload
// (bytes * n / (n-1)) is what GShard keeps constant.
TEST_CASE("moe_lm: weak scaling, experts = ranks from 2 to 16" * doctest::skip()) {
  struct Point {
    double ranks = 0, peak_bytes = 0, all_to_all_payload = 0, all_to_all_calls = 0;
  };
  std::vector<Point> points;
  auto& memory = gshard::memory_counters();
  memory.enable();
  for (int n = 2; n <= world_size(); n *= 2) {
    MPI_Comm comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, world_rank() < n ? 0 : MPI_UNDEFINED, world_rank(), &comm);
    Point p;
    if (comm != MPI_COMM_NULL) {
      moe_lm::Options o;
      o.d_model = 64;
      o.layers = 2;
      o.heads = 2;
      o.ffn = 256;
      o.experts = n;
      o.context = 64;
      o.batch = 2 * n;
      o.steps = 4;
      o.warmup = 1;
      o.routing = "capacity";  // GShard's fixed payload (dropless's follows the routing)
      {
        moe_lm::Trainer t(moe_lm::make_mesh({1, n}, comm), o);
        t.step(corpus(), 0);  // optimizer state allocated
        memory.reset_peak();
        const gshard::CommCounters before = gshard::comm_counters();
        t.step(corpus(), 1);
        const auto a2a = gshard::comm_counters().get("expert", gshard::Collective::all_to_all);
        const auto a2a0 = before.get("expert", gshard::Collective::all_to_all);
        p = {static_cast<double>(n), static_cast<double>(memory.peak_bytes()),
             static_cast<double>(a2a.bytes - a2a0.bytes) * n / (n - 1),
             static_cast<double>(a2a.calls - a2a0.calls)};
      }
      MPI_Comm_free(&comm);
    }
    // Every rank checks world rank 0's numbers (rank 0 takes part at every n).
    MPI_Bcast(&p, 4, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    points.push_back(p);
    if (world_rank() == 0)
      MESSAGE("ranks = experts = " << n << ": peak " << p.peak_bytes / 1e6 << " MB per rank, "
                                   << "AllToAll payload " << p.all_to_all_payload / 1e6
                                   << " MB per step in " << p.all_to_all_calls << " calls");
  }
  REQUIRE(points.size() >= 1);
  for (const Point& p : points) {
    INFO("ranks = experts = " << p.ranks);
    CHECK(p.all_to_all_calls == 4);  // 2 forward + 2 backward, one MoE layer
    CHECK(std::abs(p.peak_bytes / points.front().peak_bytes - 1) <= 0.05);
    CHECK(std::abs(p.all_to_all_payload / points.front().all_to_all_payload - 1) <= 0.05);
  }
}
