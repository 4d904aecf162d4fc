#pragma once
// Device math that compiles on Kokkos 3.4 (functions under Kokkos::Experimental) and on
// Kokkos 3.6+ / 4 / 5 (under Kokkos::).
#include <Kokkos_Core.hpp>

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
