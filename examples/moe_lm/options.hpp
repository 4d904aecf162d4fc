#pragma once
// The main job's options (their defaults, the mesh shape, a one-line summary); parsed from the
// command line in cli.hpp. Apart from CLI11, so the files that compile the model do not parse it.
#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include <gshard/core/error.hpp>

namespace moe_lm {

/// Defaults: the reference model (d_model 128, 4 blocks, 8 experts, context 128,
/// batch 32) with AdamW-style settings that train a byte model of this size well; as many steps
/// as fill --time-limit on this machine (the README run: 9 minutes of its 10; the cosine schedule
/// is fitted to that count after the first steps), with the limit as the hard stop.
struct Options {
  std::string mesh = "2x2";  // data x expert [x model]
  std::vector<int> mesh_shape = {2, 2};
  int d_model = 128;
  int layers = 4;  // transformer blocks; every other one is MoE (GShard)
  int heads = 4;   // head size 32
  int ffn = 512;   // hidden size of the dense and expert FFNs (4 x d_model)
  int experts = 8;
  double capacity_factor = 2.0;      // GShard's top-2 setting
  std::string routing = "capacity";  // or "dropless": every routed assignment computed
  std::string balance = "aux";       // or "bias" (DeepSeek-V3) or "both"
  double bias_rate = 1e-3;           // the selection bias's step (balance bias or both)
  int context = 128;
  int batch = 32;    // global rows per step, split over the data axis
  int steps = 0;     // 0: as many as fill --time-limit (fitted at the warmup's end)
  double lr = 2e-3;  // peak, after linear warmup
  int warmup = 50;
  int eval_every = 50;
  int eval_batches = 4;        // held-out batches per evaluation
  double time_limit = 560;     // seconds from start to the end of training; 0: none
  std::string checkpoint_dir;  // empty: no checkpoints
  std::uint64_t seed = 1;
  std::string out = "moe_lm_out";  // loss.csv, loss.png, expert_load.csv/png, samples.txt
  int sample_bytes = 160;          // generated text per language at the end
  std::string trace;               // Chrome trace JSON of the first trace_steps steps ("": none)
  int trace_steps = 5;
};

/// Parses "2x2", "4x2x1": 2 or 3 positive extents (data x expert [x model]).
inline std::vector<int> parse_mesh(const std::string& text) {
  std::vector<int> shape;
  std::stringstream in(text);
  std::string piece;
  const auto bad = [&] {
    return gshard::Error(
        "moe_lm::parse_mesh",
        "mesh '" + text + "' must be data x expert [x model] extents, e.g. 2x2 or 2x1x2");
  };
  while (std::getline(in, piece, 'x')) {
    if (piece.empty() || piece.size() > 6 ||
        piece.find_first_not_of("0123456789") != std::string::npos)
      throw bad();
    const int extent = std::stoi(piece);
    if (extent < 1) throw bad();
    shape.push_back(extent);
  }
  if (shape.size() < 2 || shape.size() > 3 || text.back() == 'x') throw bad();
  return shape;
}

/// The number of ranks a mesh needs.
inline int mesh_ranks(const std::vector<int>& shape) {
  int n = 1;
  for (const int e : shape) n *= e;
  return n;
}

/// The options as one line per group, for the run's header.
inline std::string describe(const Options& o) {
  std::ostringstream s;
  s << "mesh " << o.mesh << " (data x expert" << (o.mesh_shape.size() == 3 ? " x model" : "")
    << "), d_model " << o.d_model << ", " << o.layers << " blocks, " << o.heads << " heads, ffn "
    << o.ffn << ", " << o.experts << " experts, "
    << (o.routing == "dropless" ? std::string("dropless")
                                : "capacity factor " + std::to_string(o.capacity_factor))
    << ", balance " << o.balance << "\n"
    << "context " << o.context << ", batch " << o.batch << ", "
    << (o.steps > 0 ? std::to_string(o.steps) : std::string("time-fitted")) << " steps, lr " << o.lr
    << " (warmup " << o.warmup << "), eval every " << o.eval_every << " x " << o.eval_batches
    << " batches, time limit " << o.time_limit << " s, seed " << o.seed << ", out " << o.out
    << "\n";
  return s.str();
}

}  // namespace moe_lm
