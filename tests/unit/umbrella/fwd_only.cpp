// A translation unit that names gshard's types through gshard/gshard_fwd.hpp only (as a model's
// header would): no Kokkos, no MPI, no definitions.
#include <gshard/gshard_fwd.hpp>

#if defined(KOKKOS_VERSION) || defined(MPI_VERSION)
#error "gshard/gshard_fwd.hpp must not include Kokkos or MPI"
#endif

#include <vector>

namespace umbrella {

using M = gshard::Mesh<"x">;
using V = gshard::Sharded<double, M, "I:x">;

std::vector<double> doubled(const V& v);  // defined in einsum_only.cpp

/// Passes a tensor through a function declared with the forward declarations alone.
std::vector<double> through_fwd(const V& v) { return doubled(v); }

}  // namespace umbrella
