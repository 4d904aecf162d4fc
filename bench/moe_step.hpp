#pragma once
// What bench_moe and bench_trace time: one forward + backward of the MoE layer on a line of
// ranks (x "G:x S M", router "M E", experts "E:x M H" / "E:x H M"), and how they summarise.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <vector>

#include <gshard/gshard.hpp>

#include "common.hpp"

namespace bench {

namespace gs = gshard;
using Line = gs::Mesh<"x">;
using X = gs::Sharded<float, Line, "G:x S M">;
using Wg = gs::Sharded<float, Line, "M E">;
using Wi = gs::Sharded<float, Line, "E:x M H">;
using Wo = gs::Sharded<float, Line, "E:x H M">;

inline double now() { return MPI_Wtime(); }

// Max over ranks: a step ends when its slowest rank does.
inline double max_over_ranks(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

// What a step's MoeResult said about routing (global counts, the same on every rank).
struct MoeStats {
  std::vector<std::int64_t> tokens_per_expert;  // kept (token, choice) assignments
  double dropped_fraction = 0;                  // of the routed assignments
  std::int64_t capacity = 0;                    // C (0: dropless)
};

// Tracks x and the weights, y = moe(...), loss = sum(y * r) + aux_loss (r fixed and random, so
// every gradient is dense), grad of the loss with respect to all four; seconds, max over ranks.
// With `stats`, the step's routing statistics are copied there (after the timing).
inline double moe_step(X& x, Wg& wg, Wi& wi, Wo& wo, const X& r, const gs::nn::MoeOptions& o,
                       MoeStats* stats = nullptr) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = now();
  gs::track(std::tie(x, wg, wi, wo));
  const auto out = gs::nn::moe(x, wg, wi, wo, o);
  const auto loss = gs::sum<"GSM">(out.output * r) + out.aux_loss;
  auto g = gs::grad(loss, std::tie(x, wg, wi, wo));
  gs::untrack(std::tie(x, wg, wi, wo));
  // Touch the gradients so nothing is left unevaluated.
  volatile float sink = std::get<0>(g).local_size() > 0 ? 0.0f : 1.0f;
  (void)sink;
  const double t = max_over_ranks(now() - t0);
  if (stats) *stats = {out.tokens_per_expert, out.dropped_fraction, out.capacity};
  return t;
}

}  // namespace bench
