#pragma once
// FLOP counters: the floating-point operations of every local contraction (an einsum's batched
// GEMM: 2 per multiply-add), counted on this rank when the GEMM is issued. A function of the
// shapes alone, so benchmarks and tests can compare ranks, meshes and runs exactly. Elementwise
// ops are not counted (memory-bound; their cost is bytes, not FLOPs).
#include <cstdint>

namespace gshard {

class FlopCounters {
 public:
  void add_contraction(std::int64_t flops) { contraction_ += flops; }
  /// FLOPs of the local contractions since the start or the last reset().
  [[nodiscard]] std::int64_t contraction() const { return contraction_; }
  void reset() { contraction_ = 0; }

 private:
  std::int64_t contraction_ = 0;
};

/// The process-wide counters every local contraction reports to.
inline FlopCounters& flop_counters() {
  static FlopCounters counters;
  return counters;
}

}  // namespace gshard
