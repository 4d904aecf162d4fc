#pragma once
// Device math that compiles on Kokkos 3.4 (functions under Kokkos::Experimental) and on
// Kokkos 3.6+ / 4 / 5 (under Kokkos::).
#include <Kokkos_Core.hpp>
#include <type_traits>

namespace gshard::math {
#if KOKKOS_VERSION < 30600
using Kokkos::Experimental::cos;
using Kokkos::Experimental::erf;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#else
using Kokkos::cos;
using Kokkos::erf;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sqrt;
using Kokkos::tanh;
#endif
}  // namespace gshard::math

namespace gshard::detail {
/// target += v from a kernel whose iterations may hit the same target: atomic, except when the
/// default execution space is Serial, which runs the iterations one after another.
template <class T>
KOKKOS_INLINE_FUNCTION void add_to(T& target, const T v) {
#if defined(KOKKOS_ENABLE_SERIAL)
  if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::Serial>) {
    target += v;
    return;
  }
#endif
  Kokkos::atomic_add(&target, v);
}
}  // namespace gshard::detail

#include "../core/trace.hpp"

namespace gshard::detail {
/// A trace span around device work: while tracing, it fences before starting the clock and
/// before stopping it, so that the span times the kernels, not their launch (asynchronous
/// backends return at once). Untraced, it fences nothing.
class KernelSpan : public TraceSpan {
 public:
  KernelSpan(const char* category, const char* name) : TraceSpan((drain(), category), name) {}
  KernelSpan(const KernelSpan&) = delete;
  KernelSpan& operator=(const KernelSpan&) = delete;
  ~KernelSpan() {
    if (on()) Kokkos::DefaultExecutionSpace().fence();
  }

 private:
  static void drain() {
    if (tracing()) Kokkos::DefaultExecutionSpace().fence();
  }
};
}  // namespace gshard::detail
