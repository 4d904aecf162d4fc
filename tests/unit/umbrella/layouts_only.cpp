// A translation unit that includes only gshard/layouts.hpp: compile-time layout checking with no
// MPI and no Kokkos (the #errors fail the build if the header pulled either in).
#include <gshard/layouts.hpp>

#if defined(KOKKOS_VERSION) || defined(MPI_VERSION)
#error "gshard/layouts.hpp must not include Kokkos or MPI"
#endif

#include <array>
#include <string_view>

namespace umbrella {

namespace {
constexpr std::array<std::string_view, 2> axes{"data", "expert"};
constexpr gshard::Layout x = gshard::parse_layout("G:data S M", axes).layout;
constexpr gshard::Layout w = gshard::parse_layout("E:expert M H", axes).layout;
constexpr gshard::EinsumLayouts r =
    gshard::infer_einsum(gshard::parse_einsum("GSM,EMH->EGSH").spec, x, w);
// Einsum rule 1: the output keeps each operand's splits; nothing moves.
static_assert(r.output == gshard::parse_layout("E:expert G:data S H", axes).layout);
static_assert(r.operands[0] == x && r.operands[1] == w);
}  // namespace

/// The inferred output's rank, for the run-time check in einsum_only.cpp.
int inferred_output_rank() { return r.output.rank; }

}  // namespace umbrella
