#pragma once
// Compile-time diagnostics in the user's terms. Each mistake instantiates a template whose name
// says what is wrong and whose arguments are the offending axis, label or piece and the whole
// spec, so g++ and clang print them on the first line of the error, e.g.
//   In instantiation of 'struct gshard::spec_error::unknown_mesh_axis<"exprt", "G:exprt S M">'
#include "fixed_string.hpp"
#include "layout.hpp"

namespace gshard {

namespace spec_error {
template <class>
inline constexpr bool always_false = false;

template <auto Piece, auto Spec>
struct malformed_piece {
  static_assert(always_false<malformed_piece>,
                "gshard layout spec: malformed piece; write 'L', 'L:axis', 'L:a*b' or a trailing "
                "'+axis' (the piece is the first argument above)");
};
template <auto Axis, auto Spec>
struct unknown_mesh_axis {
  static_assert(always_false<unknown_mesh_axis>,
                "gshard layout spec: names a mesh axis that the Mesh does not have");
};
template <auto Label, auto Spec>
struct label_used_twice {
  static_assert(always_false<label_used_twice>, "gshard layout spec: a label names two dimensions");
};
template <auto Axis, auto Spec>
struct mesh_axis_used_twice {
  static_assert(always_false<mesh_axis_used_twice>,
                "gshard layout spec: a mesh axis is used twice (one axis splits one dimension "
                "or holds one partial sum)");
};
template <auto Axis, auto Spec>
struct partial_axis_also_splits_a_dimension {
  static_assert(always_false<partial_axis_also_splits_a_dimension>,
                "gshard layout spec: an axis cannot both split a dimension and hold a partial sum");
};
template <auto Piece, auto Spec>
struct dimension_after_partial_axis {
  static_assert(always_false<dimension_after_partial_axis>,
                "gshard layout spec: '+axis' pieces must come after every dimension");
};
template <auto Piece, auto Spec>
struct too_many_dimensions {
  static_assert(always_false<too_many_dimensions>, "gshard layout spec: more than 8 dimensions");
};
}  // namespace spec_error

namespace detail {

/// True when Spec parses against the mesh's axes; otherwise instantiates the diagnostic that
/// names the mistake (and so stops compilation there).
template <class MeshT, fixed_string Spec>
constexpr bool check_spec() {
  constexpr SpecParse parsed = parse_layout(Spec.view(), MeshT::axis_names);
  if constexpr (parsed.error == SpecError::none) {
    return true;
  } else {
    constexpr auto what = make_fixed<parsed.offending.size()>(parsed.offending);
    if constexpr (parsed.error == SpecError::malformed_piece) {
      return sizeof(spec_error::malformed_piece<detail::shown<what>, detail::shown<Spec>>) == 0;
    } else if constexpr (parsed.error == SpecError::unknown_axis) {
      return sizeof(spec_error::unknown_mesh_axis<detail::shown<what>, detail::shown<Spec>>) == 0;
    } else if constexpr (parsed.error == SpecError::label_used_twice) {
      return sizeof(spec_error::label_used_twice<detail::shown<what>, detail::shown<Spec>>) == 0;
    } else if constexpr (parsed.error == SpecError::axis_used_twice) {
      return sizeof(spec_error::mesh_axis_used_twice<detail::shown<what>, detail::shown<Spec>>) ==
             0;
    } else if constexpr (parsed.error == SpecError::partial_axis_splits) {
      return sizeof(spec_error::partial_axis_also_splits_a_dimension<detail::shown<what>,
                                                                     detail::shown<Spec>>) == 0;
    } else if constexpr (parsed.error == SpecError::dimension_after_partial) {
      return sizeof(spec_error::dimension_after_partial_axis<detail::shown<what>,
                                                             detail::shown<Spec>>) == 0;
    } else {
      return sizeof(spec_error::too_many_dimensions<detail::shown<what>, detail::shown<Spec>>) == 0;
    }
  }
}

}  // namespace detail
/// Strict mode: define GSHARD_STRICT (in every translation unit of a program, e.g. with
/// target_compile_definitions) to make every implicit collective a compile error.
#if defined(GSHARD_STRICT)
inline constexpr bool strict_mode = true;
#else
inline constexpr bool strict_mode = false;
#endif

namespace strict_error {
template <class>
inline constexpr bool always_false = false;
/// Op, which operand (0-based), its layout, and the layout the op needs it in.
template <auto Op, int Operand, auto OperandLayout, auto NeededLayout>
struct implicit_collective {
  static_assert(
      always_false<implicit_collective>,
      "gshard strict mode (GSHARD_STRICT): this operand needs communication to reach "
      "the layout the op needs; write gshard::reshard<gshard::Sharded<T, Mesh, "
      "NeededLayout>>(operand) yourself (op, operand, both layouts: the arguments above)");
};
/// An expression evaluated into a declared layout that needs communication to reach.
template <auto ExpressionLayout, auto DeclaredLayout>
struct evaluation_into_layout_communicates {
  static_assert(always_false<evaluation_into_layout_communicates>,
                "gshard strict mode (GSHARD_STRICT): evaluating this expression into the declared "
                "layout moves data between ranks; write gshard::reshard<Target>(expr) to make the "
                "collective explicit (both layouts: the arguments above)");
};
}  // namespace strict_error

}  // namespace gshard
