#pragma once
// Device math that compiles on Kokkos 3.4 (functions under Kokkos::Experimental) and on
// Kokkos 3.6+ / 4 / 5 (under Kokkos::).
#include <Kokkos_Core.hpp>

namespace gshard::math {
#if KOKKOS_VERSION < 30600
using Kokkos::Experimental::cos;
using Kokkos::Experimental::exp;
using Kokkos::Experimental::log;
using Kokkos::Experimental::sqrt;
#else
using Kokkos::cos;
using Kokkos::exp;
using Kokkos::log;
using Kokkos::sqrt;
#endif
}  // namespace gshard::math
