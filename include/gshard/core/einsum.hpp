#pragma once
// Einsum specs ("GSM,EMH->EGSH") and the layout rules of a sharded einsum, all at compile time.
//
// The rules (docs/design.md, "Einsum layout rules") give, from the operands' layouts, the layout
// each operand is brought to before the local contraction and the layout of the result:
//   1. Output labels, in output order, take a split: a batch label (in both operands) takes the
//      first operand's axes, or the second's when the first does not split it; a label of one
//      operand takes that operand's axes. An axis already taken leaves the label replicated.
//   2. Contracting labels (both operands, not the output), in the first operand's order, take the
//      first operand's axes, or the second's: the other operand is sliced to match (local), and
//      the result is a partial sum over those axes. Taken axes leave the label replicated.
//   3. Labels of one operand that the output drops are summed locally: partial over their axes
//      when free, replicated otherwise.
//   4. Pending partial sums of an operand stay pending in the result (the einsum is linear in
//      each operand) when no label of either operand uses that axis; when both operands are
//      partial over one axis, the first operand's are finished and the second's stay pending.
//      Pending max/min partials are never kept: such an operand must be finished first.
#include <array>
#include <cstddef>
#include <string_view>

#include "fixed_string.hpp"
#include "layout.hpp"

namespace gshard {

inline constexpr int max_einsum_labels = 16;

/// A parsed einsum: one or two operands and the output, each a string of distinct labels.
struct EinsumSpec {
  int operand_count = 0;
  std::array<std::string_view, 2> operands{};
  std::string_view output{};
};

enum class EinsumError {
  none,
  malformed,       // no "->", more than two operands, a non-letter
  label_repeated,  // a label twice in one operand or in the output (no diagonals)
  output_label_not_in_inputs,
  too_many_labels,  // more than max_dims labels in one term
};

struct EinsumParse {
  EinsumSpec spec{};
  EinsumError error = EinsumError::none;
  std::string_view offending{};
};

namespace detail {
constexpr bool distinct_letters(std::string_view s, std::string_view& repeated) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!is_letter(s[i])) {
      repeated = s.substr(i, 1);
      return false;
    }
    for (std::size_t j = i + 1; j < s.size(); ++j)
      if (s[i] == s[j]) {
        repeated = s.substr(j, 1);
        return false;
      }
  }
  return true;
}
// A loop, not string_view::find: under ASan, GCC 12 cannot constant-fold find's null check of a
// view of a template parameter object.
constexpr bool has_label(std::string_view s, char c) {
  for (char x : s)
    if (x == c) return true;
  return false;
}
}  // namespace detail

constexpr EinsumParse parse_einsum(std::string_view text) {
  EinsumParse out;
  auto fail = [&](EinsumError e, std::string_view what) {
    out.error = e;
    out.offending = what;
    return out;
  };
  std::size_t arrow = 0;
  while (arrow + 1 < text.size() && !(text[arrow] == '-' && text[arrow + 1] == '>')) ++arrow;
  if (arrow + 1 >= text.size()) return fail(EinsumError::malformed, text);
  const std::string_view inputs = text.substr(0, arrow);
  out.spec.output = text.substr(arrow + 2);
  std::size_t comma = 0;
  while (comma < inputs.size() && inputs[comma] != ',') ++comma;
  out.spec.operands[0] = inputs.substr(0, comma);
  out.spec.operand_count = 1;
  if (comma < inputs.size()) {
    out.spec.operands[1] = inputs.substr(comma + 1);
    out.spec.operand_count = 2;
    for (char c : out.spec.operands[1])
      if (c == ',') return fail(EinsumError::malformed, text);
  }
  std::string_view bad{};
  for (int i = 0; i < out.spec.operand_count; ++i)
    if (out.spec.operands[static_cast<std::size_t>(i)].size() > static_cast<std::size_t>(max_dims))
      return fail(EinsumError::too_many_labels, out.spec.operands[static_cast<std::size_t>(i)]);
  if (out.spec.output.size() > static_cast<std::size_t>(max_dims))
    return fail(EinsumError::too_many_labels, out.spec.output);
  for (int i = 0; i < out.spec.operand_count; ++i) {
    if (!detail::distinct_letters(out.spec.operands[static_cast<std::size_t>(i)], bad))
      return fail(detail::is_letter(bad[0]) ? EinsumError::label_repeated : EinsumError::malformed,
                  bad);
  }
  if (!detail::distinct_letters(out.spec.output, bad))
    return fail(detail::is_letter(bad[0]) ? EinsumError::label_repeated : EinsumError::malformed,
                bad);
  for (std::size_t i = 0; i < out.spec.output.size(); ++i) {
    const char c = out.spec.output[i];
    bool found = detail::has_label(out.spec.operands[0], c);
    if (out.spec.operand_count == 2) found = found || detail::has_label(out.spec.operands[1], c);
    if (!found) return fail(EinsumError::output_label_not_in_inputs, out.spec.output.substr(i, 1));
  }
  return out;
}

/// The layouts of a sharded einsum: what each operand is brought to, and the result.
struct EinsumLayouts {
  std::array<Layout, 2> operands{};
  Layout output{};
};

/// The rules above. `a` (and `b` for two operands) are the operands' layouts.
constexpr EinsumLayouts infer_einsum(const EinsumSpec& spec, const Layout& a, const Layout& b) {
  const bool binary = spec.operand_count == 2;
  EinsumLayouts r;
  r.operands[0] = a;
  r.operands[1] = binary ? b : Layout{};
  bool taken[max_axes]{};
  auto axes_of = [&](int which, char label) -> DimLayout {
    const Layout& l = which == 0 ? a : b;
    if (which == 1 && !binary) return {};
    const int d = l.find(label);
    return d < 0 ? DimLayout{} : l.dims[d];
  };
  auto free_of_taken = [&](const DimLayout& d) {
    for (int i = 0; i < d.axis_count; ++i)
      if (taken[d.axes[i]]) return false;
    return true;
  };
  auto take = [&](const DimLayout& d) {
    for (int i = 0; i < d.axis_count; ++i) taken[d.axes[i]] = true;
  };
  // Sets label's axes in every operand that has it.
  auto assign = [&](char label, const DimLayout& axes) {
    for (int w = 0; w < (binary ? 2 : 1); ++w) {
      Layout& l = r.operands[static_cast<std::size_t>(w)];
      const int d = l.find(label);
      if (d < 0) continue;
      DimLayout nd = axes;
      nd.label = label;
      l.dims[d] = nd;
    }
  };
  auto in = [&](int which, char c) {
    return which == 0 ? a.find(c) >= 0 : (binary && b.find(c) >= 0);
  };

  // 1. Output labels.
  r.output.rank = static_cast<int>(spec.output.size());
  for (int o = 0; o < r.output.rank; ++o) {
    const char c = spec.output[static_cast<std::size_t>(o)];
    DimLayout pick = axes_of(0, c);
    if (pick.axis_count == 0 && in(1, c)) pick = axes_of(1, c);
    if (!free_of_taken(pick)) pick = DimLayout{};
    take(pick);
    pick.label = c;
    r.output.dims[o] = pick;
    assign(c, pick);
  }
  // 2. Contracting labels, 3. labels summed away: partial sums over their axes.
  int partial_count = 0;
  std::array<int, max_axes> partial{};
  for (int w = 0; w < (binary ? 2 : 1); ++w) {
    const Layout& l = w == 0 ? a : b;
    for (int d = 0; d < l.rank; ++d) {
      const char c = l.dims[d].label;
      if (r.output.find(c) >= 0) continue;
      if (w == 1 && in(0, c)) continue;  // a contracting label, handled with the first operand
      DimLayout pick = axes_of(w, c);
      if (pick.axis_count == 0 && w == 0 && in(1, c)) pick = axes_of(1, c);
      if (!free_of_taken(pick)) pick = DimLayout{};
      take(pick);
      assign(c, pick);
      for (int i = 0; i < pick.axis_count; ++i)
        partial[static_cast<std::size_t>(partial_count++)] = pick.axes[i];
    }
  }
  // 4. Pending partial sums of the operands.
  for (int w = 0; w < (binary ? 2 : 1); ++w) {
    const Layout& l = w == 0 ? a : b;
    Layout& need = r.operands[static_cast<std::size_t>(w)];
    need.partial_count = 0;
    for (int i = 0; i < l.partial_count; ++i) {
      const int x = l.partial[i];
      const bool other_partial = binary && (w == 0 ? b.is_partial(x) : false);
      const bool kept_by_first = w == 1 && r.operands[0].is_partial(x);
      if (taken[x] || other_partial || kept_by_first) continue;  // finished before contracting
      need.partial[need.partial_count++] = x;
      partial[static_cast<std::size_t>(partial_count++)] = x;
    }
  }
  for (int i = 0; i < partial_count; ++i)
    r.output.partial[i] = partial[static_cast<std::size_t>(i)];
  r.output.partial_count = partial_count;
  return r;
}

/// Writes a layout as a spec with the given axis names (for the result's type).
template <std::size_t N>
constexpr std::size_t layout_spec_length(const Layout& l,
                                         const std::array<std::string_view, N>& axes) {
  std::size_t n = 0;
  for (int d = 0; d < l.rank; ++d) {
    n += (d ? 1 : 0) + 1;
    for (int i = 0; i < l.dims[d].axis_count; ++i)
      n += 1 + axes[static_cast<std::size_t>(l.dims[d].axes[i])].size();
  }
  for (int i = 0; i < l.partial_count; ++i)
    n += (n ? 1 : 0) + 1 + axes[static_cast<std::size_t>(l.partial[i])].size();
  return n;
}

template <std::size_t Length, std::size_t N>
constexpr fixed_string layout_spec(const Layout& l, const std::array<std::string_view, N>& axes) {
  static_assert(Length < fixed_string::capacity,
                "gshard: an inferred layout spec is longer than 63 characters");
  fixed_string s;
  std::size_t n = 0;
  auto put = [&](std::string_view t) {
    for (char c : t) s.data[n++] = c;
  };
  for (int d = 0; d < l.rank; ++d) {
    if (d) put(" ");
    s.data[n++] = l.dims[d].label;
    for (int i = 0; i < l.dims[d].axis_count; ++i) {
      put(i ? "*" : ":");
      put(axes[static_cast<std::size_t>(l.dims[d].axes[i])]);
    }
  }
  for (int i = 0; i < l.partial_count; ++i) {
    if (n) put(" ");
    put("+");
    put(axes[static_cast<std::size_t>(l.partial[i])]);
  }
  return s;
}

}  // namespace gshard
