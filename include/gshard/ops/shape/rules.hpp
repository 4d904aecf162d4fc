#pragma once
// The layout rules of merge, split, concat, slice and pad (constexpr: the typed API applies them
// at compile time), their compile-time errors and the checks of the typed API (ops/shape.hpp).
#include <cstddef>
#include <string_view>
#include <utility>

#include "../../core/einsum.hpp"
#include "../../expr/node.hpp"
#include "../../tensor/sharded.hpp"

namespace gshard {

namespace shape_error {
template <class>
inline constexpr bool always_false = false;
template <auto Label, auto OperandSpec>
struct label_not_in_operand {
  static_assert(always_false<label_not_in_operand>,
                "gshard shape op: the label is not a label of the operand's spec");
};
template <auto Labels>
struct give_exactly_one_label {
  static_assert(always_false<give_exactly_one_label>,
                "gshard shape op: give exactly one label here (one letter)");
};
template <auto Labels>
struct give_two_or_more_labels {
  static_assert(always_false<give_two_or_more_labels>,
                "gshard::merge/split: give two or more labels to merge, or to split into");
};
template <auto Label, auto Labels>
struct label_repeated {
  static_assert(always_false<label_repeated>,
                "gshard::merge/split: a label appears twice among the labels given");
};
template <auto Label, auto OperandSpec>
struct new_label_already_in_operand {
  static_assert(always_false<new_label_already_in_operand>,
                "gshard::merge/split: a new label is already a label of the operand; pick another "
                "letter");
};
template <auto Labels, auto OperandSpec>
struct result_has_more_than_8_dimensions {
  static_assert(always_false<result_has_more_than_8_dimensions>,
                "gshard::split: the result would have more than 8 dimensions");
};
template <auto FirstSpec, auto OtherSpec>
struct concat_operands_differ_in_labels {
  static_assert(always_false<concat_operands_differ_in_labels>,
                "gshard::concat: every operand must have the same labels (any order); rename them "
                "with .as<\"...\">()");
};
}  // namespace shape_error

namespace detail {

// --- layout rules (constexpr: the typed API applies them at compile time) ----------------------

/// merge: the merged label takes the place of the merged label that comes first in memory
/// order; the other labels keep their order. It is split over the merged labels' axes, in the
/// order the labels are given (major first), so no axis becomes replicated.
constexpr Layout merge_layout(const Layout& in, std::string_view labels, char merged) {
  Layout out;
  out.partial_count = in.partial_count;
  out.partial = in.partial;
  bool placed = false;
  for (int d = 0; d < in.rank; ++d) {
    if (!has_label(labels, in.dims[d].label)) {
      out.dims[out.rank++] = in.dims[d];
      continue;
    }
    if (placed) continue;
    placed = true;
    DimLayout& m = out.dims[out.rank++];
    m.label = merged;
    for (char c : labels) {
      const DimLayout& src = in.dims[in.find(c)];
      for (int i = 0; i < src.axis_count; ++i) m.axes[m.axis_count++] = src.axes[i];
    }
  }
  return out;
}

/// merge's staging layout: the merged labels adjacent in the given order at the result's
/// position, the first holding all their axes, the others unsplit. Reaching it from the input
/// is the planner's job (nothing moves when the labels are already adjacent, in order, and only
/// the first is split).
constexpr Layout merge_staging_layout(const Layout& in, std::string_view labels) {
  const Layout r = merge_layout(in, labels, labels[0]);
  Layout out;
  out.partial_count = in.partial_count;
  out.partial = in.partial;
  for (int d = 0; d < r.rank; ++d) {
    if (r.dims[d].label != labels[0]) {
      out.dims[out.rank++] = r.dims[d];
      continue;
    }
    out.dims[out.rank++] = r.dims[d];
    for (std::size_t i = 1; i < labels.size(); ++i) {
      DimLayout minor;
      minor.label = labels[i];
      out.dims[out.rank++] = minor;
    }
  }
  return out;
}

/// split: the new labels take the split label's place, in the given order; the first (major)
/// takes its axes, the others are unsplit.
constexpr Layout split_layout(const Layout& in, char label, std::string_view into) {
  Layout out;
  out.partial_count = in.partial_count;
  out.partial = in.partial;
  for (int d = 0; d < in.rank; ++d) {
    if (in.dims[d].label != label) {
      out.dims[out.rank++] = in.dims[d];
      continue;
    }
    DimLayout major = in.dims[d];
    major.label = into[0];
    out.dims[out.rank++] = major;
    for (std::size_t i = 1; i < into.size(); ++i) {
      DimLayout minor;
      minor.label = into[i];
      out.dims[out.rank++] = minor;
    }
  }
  return out;
}

/// concat: the first operand's layout, pending partial axes the union of the operands' (adding
/// one is local: the other copies hold zeros).
constexpr Layout concat_layout(const Layout& first, const Layout& other) {
  Layout out = first;
  for (int i = 0; i < other.partial_count; ++i)
    if (!out.is_partial(other.partial[i]) && out.dim_on_axis(other.partial[i]) < 0)
      out.partial[out.partial_count++] = other.partial[i];
  return out;
}

/// Where a concat operand is brought before the exchange: the result's layout, except that the
/// concatenated label keeps the operand's own axes (minus any the result uses elsewhere), so an
/// operand split differently along it is moved by the exchange itself, not resharded first.
constexpr Layout concat_operand_layout(const Layout& result, const Layout& operand, char label) {
  Layout out = result;
  const int d = out.find(label);
  const DimLayout& own = operand.dims[operand.find(label)];
  DimLayout& dim = out.dims[d];
  dim.axis_count = 0;
  for (int i = 0; i < own.axis_count; ++i) {
    const int a = own.axes[i];
    const int elsewhere = result.dim_on_axis(a);
    if ((elsewhere >= 0 && elsewhere != d) || result.is_partial(a)) continue;
    dim.axes[dim.axis_count++] = a;
  }
  return out;
}

// --- compile-time checks of the labels ----------------------------------------------------------

template <fixed_string Label, class X>
constexpr bool check_one_label() {
  if constexpr (Label.size() != 1) {
    return sizeof(shape_error::give_exactly_one_label<detail::shown<Label>>) == 0;
  } else if constexpr (X::layout.find(Label.data[0]) < 0) {
    return sizeof(
               shape_error::label_not_in_operand<detail::shown<Label>, detail::shown<X::spec>>) ==
           0;
  } else {
    return true;
  }
}

constexpr int repeated_at(std::string_view s) {
  for (std::size_t i = 0; i < s.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (s[i] == s[j]) return static_cast<int>(i);
  return -1;
}

constexpr int missing_at(std::string_view s, const Layout& l) {
  for (std::size_t i = 0; i < s.size(); ++i)
    if (l.find(s[i]) < 0) return static_cast<int>(i);
  return -1;
}

template <fixed_string Labels, fixed_string Merged, class X>
constexpr bool check_merge() {
  constexpr std::string_view labels = Labels.view();
  constexpr int repeated = repeated_at(labels);
  constexpr int missing = missing_at(labels, X::layout);
  if constexpr (Labels.size() < 2) {
    return sizeof(shape_error::give_two_or_more_labels<detail::shown<Labels>>) == 0;
  } else if constexpr (repeated >= 0) {
    constexpr auto what = make_fixed<1>(labels.substr(static_cast<std::size_t>(repeated), 1));
    return sizeof(shape_error::label_repeated<detail::shown<what>, detail::shown<Labels>>) == 0;
  } else if constexpr (missing >= 0) {
    constexpr auto what = make_fixed<1>(labels.substr(static_cast<std::size_t>(missing), 1));
    return sizeof(shape_error::label_not_in_operand<detail::shown<what>, detail::shown<X::spec>>) ==
           0;
  } else if constexpr (Merged.size() != 1) {
    return sizeof(shape_error::give_exactly_one_label<detail::shown<Merged>>) == 0;
  } else if constexpr (X::layout.find(Merged.data[0]) >= 0 && !has_label(labels, Merged.data[0])) {
    return sizeof(shape_error::new_label_already_in_operand<detail::shown<Merged>,
                                                            detail::shown<X::spec>>) == 0;
  } else {
    return true;
  }
}

template <fixed_string Label, fixed_string Into, class X>
constexpr bool check_split() {
  constexpr std::string_view into = Into.view();
  constexpr int repeated = repeated_at(into);
  constexpr int taken = [&] {
    for (std::size_t i = 0; i < into.size(); ++i)
      if (into[i] != Label.data[0] && X::layout.find(into[i]) >= 0) return static_cast<int>(i);
    return -1;
  }();
  if constexpr (!check_one_label<Label, X>()) {
    return false;
  } else if constexpr (Into.size() < 2) {
    return sizeof(shape_error::give_two_or_more_labels<detail::shown<Into>>) == 0;
  } else if constexpr (repeated >= 0) {
    constexpr auto what = make_fixed<1>(into.substr(static_cast<std::size_t>(repeated), 1));
    return sizeof(shape_error::label_repeated<detail::shown<what>, detail::shown<Into>>) == 0;
  } else if constexpr (taken >= 0) {
    constexpr auto what = make_fixed<1>(into.substr(static_cast<std::size_t>(taken), 1));
    return sizeof(shape_error::new_label_already_in_operand<detail::shown<what>,
                                                            detail::shown<X::spec>>) == 0;
  } else if constexpr (X::layout.rank - 1 + static_cast<int>(Into.size()) > max_dims) {
    return sizeof(shape_error::result_has_more_than_8_dimensions<detail::shown<Into>,
                                                                 detail::shown<X::spec>>) == 0;
  } else {
    return true;
  }
}

template <fixed_string Label, class A, class B>
constexpr bool check_concat_operand() {
  if constexpr (!same_label_set(A::layout, B::layout)) {
    return sizeof(shape_error::concat_operands_differ_in_labels<detail::shown<A::spec>,
                                                                detail::shown<B::spec>>) == 0;
  } else {
    static_assert(std::is_same_v<typename A::value_type, typename B::value_type> &&
                      std::is_same_v<typename A::mesh_type, typename B::mesh_type>,
                  "gshard::concat: operands must have the same element type and Mesh type");
    return true;
  }
}

template <class A, class... Rest>
constexpr Layout concat_result_layout() {
  Layout l = A::layout;
  ((l = concat_layout(l, Rest::layout)), ...);
  return l;
}

template <fixed_string Label, Layout Result, int Which, class X>
constexpr bool concat_strict_ok() {
  constexpr Layout need = concat_operand_layout(Result, X::layout, Label.data[0]);
  return strict_check<typename X::mesh_type, "concat", Which, X::layout, need>();
}

template <fixed_string Label, Layout Result, class... Xs, std::size_t... I>
constexpr bool concat_all_strict_ok(std::index_sequence<I...>) {
  return (concat_strict_ok<Label, Result, static_cast<int>(I), Xs>() && ...);
}

}  // namespace detail
}  // namespace gshard
