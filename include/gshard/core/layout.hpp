#pragma once
// Layouts: what a spec string such as "E:data*expert M H +model" means, parsed at compile time.
//
// Grammar: whitespace-separated pieces. A dimension piece is a one-letter label, optionally
// followed by ':' and one or more mesh axes joined by '*' (major first). Trailing '+axis' pieces
// say the values are partial sums still to be reduced over that axis. Mesh axes a spec does not
// name are replicated over.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gshard {

inline constexpr int max_dims = 8;
inline constexpr int max_axes = 4;

/// One dimension: its label and the mesh axes it is split over, major first.
struct DimLayout {
  char label = 0;
  int axis_count = 0;
  std::array<int, max_axes> axes{};  // indices into the mesh's axes

  [[nodiscard]] constexpr bool split() const noexcept { return axis_count > 0; }
  [[nodiscard]] constexpr bool uses(int axis) const noexcept {
    for (int i = 0; i < axis_count; ++i)
      if (axes[i] == axis) return true;
    return false;
  }
  constexpr bool operator==(const DimLayout&) const = default;
};

/// A whole layout: the dimensions in memory (row-major) order and the pending partial axes.
struct Layout {
  int rank = 0;
  std::array<DimLayout, max_dims> dims{};
  int partial_count = 0;
  std::array<int, max_axes> partial{};  // mesh axes with a pending reduction

  [[nodiscard]] constexpr bool is_partial(int axis) const noexcept {
    for (int i = 0; i < partial_count; ++i)
      if (partial[i] == axis) return true;
    return false;
  }
  /// The dimension split over `axis`, or -1 when the axis replicates (or is partial).
  [[nodiscard]] constexpr int dim_on_axis(int axis) const noexcept {
    for (int d = 0; d < rank; ++d)
      if (dims[d].uses(axis)) return d;
    return -1;
  }
  /// The position of `label` among the dimensions, or -1.
  [[nodiscard]] constexpr int find(char label) const noexcept {
    for (int d = 0; d < rank; ++d)
      if (dims[d].label == label) return d;
    return -1;
  }
  constexpr bool operator==(const Layout&) const = default;
};

/// What can be wrong with a spec; each kind has its own diagnostic (core/diagnostics.hpp).
enum class SpecError {
  none,
  malformed_piece,          // "G:", "GS", "G:data*", "+", a stray character
  unknown_axis,             // an axis the mesh does not have
  label_used_twice,         // "G S G"
  axis_used_twice,          // "G:data S:data" or "+data +data"
  partial_axis_splits,      // "G:data S +data"
  dimension_after_partial,  // "G +data S": partial pieces must come last
  too_many_dimensions,
};

struct SpecParse {
  Layout layout{};
  SpecError error = SpecError::none;
  std::string_view offending{};  // the piece, label or axis at fault
};

namespace detail {

constexpr bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n'; }
constexpr bool is_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
constexpr bool is_name_char(char c) { return is_letter(c) || (c >= '0' && c <= '9') || c == '_'; }
constexpr bool is_name(std::string_view s) {
  if (s.empty() || !(is_letter(s[0]) || s[0] == '_')) return false;
  for (char c : s)
    if (!is_name_char(c)) return false;
  return true;
}

template <std::size_t N>
constexpr int find_axis(const std::array<std::string_view, N>& axes, std::string_view name) {
  for (std::size_t i = 0; i < N; ++i)
    if (axes[i] == name) return static_cast<int>(i);
  return -1;
}

}  // namespace detail

/// Parses `spec` against the mesh axis names; on error, says what and where.
template <std::size_t N>
constexpr SpecParse parse_layout(std::string_view spec,
                                 const std::array<std::string_view, N>& axes) {
  SpecParse out;
  Layout& layout = out.layout;
  auto fail = [&](SpecError e, std::string_view what) {
    out.error = e;
    out.offending = what;
    return out;
  };
  bool axis_taken[max_axes + 1]{};
  std::size_t i = 0;
  while (i < spec.size()) {
    if (detail::is_space(spec[i])) {
      ++i;
      continue;
    }
    std::size_t end = i;
    while (end < spec.size() && !detail::is_space(spec[end])) ++end;
    const std::string_view piece = spec.substr(i, end - i);
    i = end;

    if (piece[0] == '+') {
      const std::string_view name = piece.substr(1);
      if (!detail::is_name(name)) return fail(SpecError::malformed_piece, piece);
      const int axis = detail::find_axis(axes, name);
      if (axis < 0) return fail(SpecError::unknown_axis, name);
      if (layout.is_partial(axis)) return fail(SpecError::axis_used_twice, name);
      if (axis_taken[axis]) return fail(SpecError::partial_axis_splits, name);
      layout.partial[layout.partial_count++] = axis;
      continue;
    }

    if (layout.partial_count > 0) return fail(SpecError::dimension_after_partial, piece);
    if (!detail::is_letter(piece[0])) return fail(SpecError::malformed_piece, piece);
    if (piece.size() > 1 && piece[1] != ':') return fail(SpecError::malformed_piece, piece);
    if (layout.rank == max_dims) return fail(SpecError::too_many_dimensions, piece);
    if (layout.find(piece[0]) >= 0) return fail(SpecError::label_used_twice, piece.substr(0, 1));
    DimLayout& dim = layout.dims[layout.rank++];
    dim.label = piece[0];
    if (piece.size() == 1) continue;

    std::string_view rest = piece.substr(2);
    if (rest.empty()) return fail(SpecError::malformed_piece, piece);
    while (true) {
      std::size_t star = 0;  // a loop, not find(): GCC 12 -fsanitize=undefined rejects find here
      while (star < rest.size() && rest[star] != '*') ++star;
      if (star == rest.size()) star = std::string_view::npos;
      const std::string_view name = rest.substr(0, star);
      if (!detail::is_name(name)) return fail(SpecError::malformed_piece, piece);
      const int axis = detail::find_axis(axes, name);
      if (axis < 0) return fail(SpecError::unknown_axis, name);
      if (axis_taken[axis]) return fail(SpecError::axis_used_twice, name);
      axis_taken[axis] = true;
      dim.axes[dim.axis_count++] = axis;
      if (star == std::string_view::npos) break;
      rest = rest.substr(star + 1);
    }
  }
  return out;
}

namespace detail {

/// "G:data S:x*y M +expert": layout `l` written with the mesh's axis names (`names[a]` names
/// axis a: an array of string views or a vector of strings). The one layout printer: the others
/// (detail::layout_string, layout_text) spell layouts through it.
template <class Names>
std::string format_layout(const Layout& l, const Names& names) {
  std::string s;
  for (int d = 0; d < l.rank; ++d) {
    if (d) s += ' ';
    s += l.dims[d].label;
    for (int i = 0; i < l.dims[d].axis_count; ++i) {
      s += i ? "*" : ":";
      s += names[static_cast<std::size_t>(l.dims[d].axes[static_cast<std::size_t>(i)])];
    }
  }
  for (int i = 0; i < l.partial_count; ++i) {
    if (!s.empty()) s += ' ';
    s += "+";
    s += names[static_cast<std::size_t>(l.partial[static_cast<std::size_t>(i)])];
  }
  return s;
}

}  // namespace detail
}  // namespace gshard
