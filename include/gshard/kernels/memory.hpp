#pragma once
// Memory counters: bytes of Kokkos allocations live on this rank now, and the most live since the
// last reset, counted through Kokkos's tool hooks (allocate/deallocate data callbacks). Opt-in:
// gshard::memory_counters().enable() installs the hooks, which replaces the allocation callbacks
// of a Kokkos tools library loaded through KOKKOS_TOOLS_LIBS (its other callbacks stay).
#include <Kokkos_Core.hpp>

#include <algorithm>
#include <cstdint>
#include <unordered_map>

namespace gshard {

class MemoryCounters {
 public:
  /// Installs the hooks (idempotent). Allocations made before this are not counted (nor is
  /// their release).
  void enable() {
    if (enabled_) return;
    enabled_ = true;
    Kokkos::Tools::Experimental::set_allocate_data_callback(&on_allocate);
    Kokkos::Tools::Experimental::set_deallocate_data_callback(&on_deallocate);
  }
  [[nodiscard]] bool enabled() const { return enabled_; }
  /// Bytes allocated (since enable) and not yet freed.
  [[nodiscard]] std::int64_t live_bytes() const { return live_; }
  /// The most live bytes since enable or the last reset_peak().
  [[nodiscard]] std::int64_t peak_bytes() const { return peak_; }
  void reset_peak() { peak_ = live_; }

 private:
  static void on_allocate(Kokkos_Profiling_SpaceHandle, const char*, const void*, std::uint64_t n);
  static void on_deallocate(Kokkos_Profiling_SpaceHandle, const char*, const void*,
                            std::uint64_t n);
  bool enabled_ = false;
  std::int64_t live_ = 0;
  std::int64_t peak_ = 0;
  std::unordered_map<const void*, std::int64_t> sizes_;
};

/// This rank's counters.
inline MemoryCounters& memory_counters() {
  static MemoryCounters c;
  return c;
}

inline void MemoryCounters::on_allocate(Kokkos_Profiling_SpaceHandle, const char*, const void* p,
                                        std::uint64_t n) {
  MemoryCounters& c = memory_counters();
  c.sizes_[p] = static_cast<std::int64_t>(n);
  c.live_ += static_cast<std::int64_t>(n);
  c.peak_ = std::max(c.peak_, c.live_);
}

inline void MemoryCounters::on_deallocate(Kokkos_Profiling_SpaceHandle, const char*, const void* p,
                                          std::uint64_t) {
  MemoryCounters& c = memory_counters();
  const auto it = c.sizes_.find(p);
  if (it == c.sizes_.end()) return;  // allocated before enable()
  c.live_ -= it->second;
  c.sizes_.erase(it);
}

}  // namespace gshard
