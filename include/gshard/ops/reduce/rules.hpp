#pragma once
// The reductions' compile-time part (ops/reduce.hpp): named diagnostics, the reduction kinds,
// label checks and the result layout, the same constexpr functions at compile time and at run
// time.
#include <string_view>

#include "../../core/diagnostics.hpp"
#include "../../core/einsum.hpp"
#include "../../core/layout.hpp"
#include "../../spmd/plan.hpp"

namespace gshard {

namespace reduce_error {
template <class>
inline constexpr bool always_false = false;
template <auto Op, auto Label, auto InputSpec>
struct label_not_in_input {
  static_assert(always_false<label_not_in_input>,
                "gshard reduction: a reduced label is not a label of the input (op, label, "
                "input spec: the arguments above)");
};
template <auto Op, auto Label, auto Labels>
struct label_repeated {
  static_assert(always_false<label_repeated>,
                "gshard reduction: a label appears twice in the labels to reduce over");
};
template <auto Op, auto InputSpec>
struct no_labels_to_reduce {
  static_assert(always_false<no_labels_to_reduce>,
                "gshard reduction: give at least one label to reduce over, e.g. sum<\"S\">(x)");
};
template <auto Op, auto InputSpec>
struct needs_floating_point {
  static_assert(always_false<needs_floating_point>,
                "gshard reduction: mean, logsumexp and norm need float or double elements");
};
}  // namespace reduce_error

namespace detail {

enum class Reduction { sum, mean, max, min, argmax, argmin, logsumexp, norm };

inline const char* reduction_name(Reduction k) {
  switch (k) {
    case Reduction::sum:
      return "sum";
    case Reduction::mean:
      return "mean";
    case Reduction::max:
      return "max";
    case Reduction::min:
      return "min";
    case Reduction::argmax:
      return "argmax";
    case Reduction::argmin:
      return "argmin";
    case Reduction::logsumexp:
      return "logsumexp";
    case Reduction::norm:
      return "norm";
  }
  return "?";
}

/// sum and mean may leave (and keep) pending partial sums; every other reduction finishes them.
constexpr bool reduction_is_linear(Reduction k) {
  return k == Reduction::sum || k == Reduction::mean;
}

/// What is wrong with the labels to reduce over: 0 none, 1 not in the input, 2 repeated,
/// 3 empty; `at` is the offending position in `labels`.
struct ReduceLabelCheck {
  int error = 0;
  std::size_t at = 0;
};

constexpr ReduceLabelCheck check_reduce_labels(std::string_view labels, const Layout& in) {
  if (labels.empty()) return {3, 0};
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (in.find(labels[i]) < 0) return {1, i};
    for (std::size_t j = 0; j < i; ++j)
      if (labels[j] == labels[i]) return {2, i};
  }
  return {0, 0};
}

/// The result's layout: the input's other labels, in its order, with their axes. A linear
/// reduction is partial over the reduced labels' axes (in the input's dimension order), then
/// over the input's pending axes (einsum's order, so sum<"G">(x) types as einsum<"GSM->SM">).
constexpr Layout reduce_layout(const Layout& in, std::string_view labels, bool linear) {
  Layout out{};
  for (int d = 0; d < in.rank; ++d)
    if (!has_label(labels, in.dims[d].label)) out.dims[out.rank++] = in.dims[d];
  if (linear) {
    for (int d = 0; d < in.rank; ++d)
      if (has_label(labels, in.dims[d].label))
        for (int i = 0; i < in.dims[d].axis_count; ++i)
          out.partial[out.partial_count++] = in.dims[d].axes[i];
    for (int i = 0; i < in.partial_count; ++i) out.partial[out.partial_count++] = in.partial[i];
  }
  return out;
}

/// The mesh axes (bitmask) that split the labels in `labels`.
constexpr unsigned reduced_axes(const Layout& in, std::string_view labels) {
  unsigned mask = 0;
  for (int d = 0; d < in.rank; ++d)
    if (has_label(labels, in.dims[d].label)) mask |= axes_of(in.dims[d]);
  return mask;
}

}  // namespace detail
}  // namespace gshard
