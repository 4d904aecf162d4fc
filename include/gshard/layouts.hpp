#pragma once
// Compile-time layout checking only: layout specs, einsum rules and their named diagnostics.
// No MPI, no Kokkos: a translation unit that checks layouts with static_assert parses in a
// fraction of a second (docs/performance.md, "Compile times").
#include "core/diagnostics.hpp"
#include "core/einsum.hpp"
#include "core/fixed_string.hpp"
#include "core/layout.hpp"
#include "version.hpp"
