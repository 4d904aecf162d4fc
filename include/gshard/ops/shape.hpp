#pragma once
// Shape ops: merge<"GS", "T">(x), split<"T", "GS">(x, {g, s}), concat<"S">(a, b, ...),
// slice<"S">(x, begin, end), pad<"S">(x, before, after, value). Eager: each returns a Sharded
// whose layout the rules below fix at compile time from the input layouts.
//
// Every one of them is, along one dimension of the result, a move of intervals: the result's
// element o along that dimension comes from one input element (shifted: concat, slice, pad;
// a merged minor part: merge, split) or is a fill value. So all share one run-time engine,
// shape_exchange: each rank knows, from the block arithmetic alone, which interval every member
// of the group over the dimension's axes holds and needs, sends each piece once (the holder
// agreeing with the receiver on the axes that replicate the source) in ONE AllToAllv over
// those axes, and copies its own pieces locally. When nothing crosses ranks (blocks line up)
// no collective runs; merge and split whose blocks line up do not even copy.
//
// Gradients: each op records the inverse move of its cotangent through the same engine
// (merge <-> split, slice -> pad with zeros, pad -> slice, concat -> one slice per operand, into
// that operand's own split), saving no values.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../expr/node.hpp"
#include "../kernels/copy_box.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/sharded.hpp"

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

// --- the run-time engine ------------------------------------------------------------------------

/// One dimension's blocks seen along the exchanged line of the result, in result coordinates:
/// index i of the dimension covers line elements [i*unit + shift, (i+1)*unit + shift) (unit > 1
/// for a major label whose minor labels are merged into the line), of which only [lo, hi) is
/// taken.
struct LineBlocks {
  DimLayout dim{};
  std::int64_t n = 0;
  std::int64_t unit = 1;
  std::int64_t shift = 0;
  std::int64_t lo = 0;
  std::int64_t hi = 0;
};

/// What one rank holds along the line: local index 0 sits at `origin`; [begin, end) is valid and
/// taken; `chunk` line elements are stored.
struct LineSpan {
  std::int64_t origin = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t chunk = 0;
};

inline LineSpan span_of(const LineBlocks& l, const std::array<int, max_axes>& sizes,
                        const Coords& c) {
  const Block b = block_of(l.dim, l.n, sizes, c);
  LineSpan s;
  s.origin = b.offset * l.unit + l.shift;
  s.begin = std::max(s.origin, l.lo);
  s.end = std::max(s.begin, std::min(s.origin + b.valid * l.unit, l.hi));
  s.chunk = b.chunk * l.unit;
  return s;
}

/// In the group over `mask`, `holder` sends `receiver` the elements of a source split as `dim`
/// only when they agree on every axis of the group that does not split the source (exactly one
/// holder per element; a rank holding an element serves itself).
inline bool serves_line(const DimLayout& dim, unsigned mask, const Coords& holder,
                        const Coords& receiver, int axis_count) {
  for (int a = 0; a < axis_count; ++a) {
    if (!(mask & (1u << a)) || dim.uses(a)) continue;
    if (holder[static_cast<std::size_t>(a)] != receiver[static_cast<std::size_t>(a)]) return false;
  }
  return true;
}

template <class T>
struct LineSource {
  const T* data = nullptr;  // padded local block, [outer, span chunk, inner] row-major
  LineBlocks line{};
};

/// [outer, length, inner] from a [outer, chunk, inner] array at line index `start`.
inline BoxCopy line_box(std::int64_t outer, std::int64_t inner, std::int64_t length,
                        std::int64_t src_chunk, std::int64_t src_start, std::int64_t dst_chunk,
                        std::int64_t dst_start) {
  BoxCopy c;
  c.rank = 3;
  c.box[0] = outer;
  c.box[1] = length;
  c.box[2] = inner;
  c.src_start[1] = src_start;
  c.dst_start[1] = dst_start;
  c.src_stride[0] = src_chunk * inner;
  c.src_stride[1] = inner;
  c.src_stride[2] = 1;
  c.dst_stride[0] = dst_chunk * inner;
  c.dst_stride[1] = inner;
  c.dst_stride[2] = 1;
  return c;
}

inline int group_index(const Coords& c, unsigned mask, const std::array<int, max_axes>& sizes,
                       int axis_count) {
  int index = 0;
  for (int a = 0; a < axis_count; ++a)
    if (mask & (1u << a))
      index = index * sizes[static_cast<std::size_t>(a)] + c[static_cast<std::size_t>(a)];
  return index;
}

/// Writes every source's pieces into `out` ([outer, dest chunk, inner]): local pieces by copy,
/// the rest in one AllToAllv over the axes of the line (skipped, on every rank alike, when no
/// piece crosses ranks anywhere: the pieces depend only on coordinates within the group, so
/// every group has the same pattern). Elements of `out` no source covers are left as they are.
template <class T>
void shape_exchange(const std::vector<LineSource<T>>& sources, const LineBlocks& dest,
                    std::int64_t outer, std::int64_t inner, T* out, const MeshState& mesh,
                    const std::vector<std::string>& axis_names) {
  const int axis_count = mesh.axis_count;
  unsigned mask = axes_of(dest.dim);
  for (const auto& s : sources) mask |= axes_of(s.line.dim);
  const int k = group_size_of(mask, mesh.sizes);
  const int me = group_index(mesh.coords, mask, mesh.sizes, axis_count);
  std::vector<Coords> member(static_cast<std::size_t>(k));
  for (int j = 0; j < k; ++j)
    member[static_cast<std::size_t>(j)] =
        member_coords(mesh.coords, mask, j, mesh.sizes, axis_count);
  struct Piece {
    std::int64_t begin = 0;
    std::int64_t end = 0;
  };
  // The piece of source s that holder h sends receiver r, in result line coordinates.
  auto piece = [&](std::size_t s, int h, int r) {
    const LineBlocks& l = sources[s].line;
    const Coords& ch = member[static_cast<std::size_t>(h)];
    const Coords& cr = member[static_cast<std::size_t>(r)];
    if (!serves_line(l.dim, mask, ch, cr, axis_count)) return Piece{};
    const LineSpan have = span_of(l, mesh.sizes, ch);
    const LineSpan need = span_of(dest, mesh.sizes, cr);
    const std::int64_t b = std::max(have.begin, need.begin);
    return Piece{b, std::max(b, std::min(have.end, need.end))};
  };
  const LineSpan mine = span_of(dest, mesh.sizes, mesh.coords);
  bool remote = false;
  for (std::size_t s = 0; s < sources.size() && !remote; ++s)
    for (int h = 0; h < k && !remote; ++h)
      for (int r = 0; r < k && !remote; ++r)
        if (h != r) {
          const Piece p = piece(s, h, r);
          remote = p.end > p.begin;
        }
  // Local pieces.
  for (std::size_t s = 0; s < sources.size(); ++s) {
    const Piece p = piece(s, me, me);
    if (p.end <= p.begin) continue;
    const LineSpan have = span_of(sources[s].line, mesh.sizes, mesh.coords);
    copy_box(sources[s].data, out,
             line_box(outer, inner, p.end - p.begin, have.chunk, p.begin - have.origin, mine.chunk,
                      p.begin - mine.origin));
  }
  if (!remote) return;
  const std::int64_t slab = outer * inner;
  std::vector<int> send_counts(static_cast<std::size_t>(k), 0);
  std::vector<int> recv_counts(static_cast<std::size_t>(k), 0);
  std::vector<int> send_displs(static_cast<std::size_t>(k), 0);
  std::vector<int> recv_displs(static_cast<std::size_t>(k), 0);
  std::int64_t send_total = 0;
  std::int64_t recv_total = 0;
  for (int j = 0; j < k; ++j) {
    const auto ju = static_cast<std::size_t>(j);
    send_displs[ju] = mpi_count(send_total, "shape op AllToAllv");
    recv_displs[ju] = mpi_count(recv_total, "shape op AllToAllv");
    if (j == me) continue;
    std::int64_t sent = 0;
    std::int64_t received = 0;
    for (std::size_t s = 0; s < sources.size(); ++s) {
      const Piece out_piece = piece(s, me, j);
      const Piece in_piece = piece(s, j, me);
      sent += (out_piece.end - out_piece.begin) * slab;
      received += (in_piece.end - in_piece.begin) * slab;
    }
    send_counts[ju] = mpi_count(sent, "shape op AllToAllv");
    recv_counts[ju] = mpi_count(received, "shape op AllToAllv");
    send_total += sent;
    recv_total += received;
  }
  Kokkos::View<T*> send(
      Kokkos::view_alloc(std::string("gshard::shape send"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(send_total));
  Kokkos::View<T*> recv(
      Kokkos::view_alloc(std::string("gshard::shape recv"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(recv_total));
  std::int64_t at = 0;
  for (int j = 0; j < k; ++j) {
    if (j == me) continue;
    for (std::size_t s = 0; s < sources.size(); ++s) {
      const Piece p = piece(s, me, j);
      const std::int64_t len = p.end - p.begin;
      if (len <= 0) continue;
      const LineSpan have = span_of(sources[s].line, mesh.sizes, mesh.coords);
      copy_box(sources[s].data, send.data() + at,
               line_box(outer, inner, len, have.chunk, p.begin - have.origin, len, 0));
      at += len * slab;
    }
  }
  {
    const MpiAccess<T> send_host(send, true);
    const MpiAccess<T> recv_host(recv, false);
    all_to_all_v(send_host.data(), send_counts, send_displs, recv_host.data(), recv_counts,
                 recv_displs, mesh.groups[mask], axes_string(mask, axis_names));
    recv_host.copy_out();
  }
  at = 0;
  for (int j = 0; j < k; ++j) {
    if (j == me) continue;
    for (std::size_t s = 0; s < sources.size(); ++s) {
      const Piece p = piece(s, j, me);
      const std::int64_t len = p.end - p.begin;
      if (len <= 0) continue;
      copy_box(static_cast<const T*>(recv.data() + at), out,
               line_box(outer, inner, len, len, 0, mine.chunk, p.begin - mine.origin));
      at += len * slab;
    }
  }
}

/// Every rank's blocks along the line coincide under `a` and `b` (origin, valid end, chunk):
/// the data can be reinterpreted without moving. Decided from the whole group, so alike
/// everywhere.
inline bool lines_coincide(const LineBlocks& a, const LineBlocks& b, const MeshState& mesh) {
  if (!same_axes(a.dim, b.dim)) return false;  // copies must sit on the same ranks
  const unsigned mask = axes_of(a.dim) | axes_of(b.dim);
  const int k = group_size_of(mask, mesh.sizes);
  for (int j = 0; j < k; ++j) {
    const Coords c = member_coords(mesh.coords, mask, j, mesh.sizes, mesh.axis_count);
    const LineSpan x = span_of(a, mesh.sizes, c);
    const LineSpan y = span_of(b, mesh.sizes, c);
    if (x.origin != y.origin || x.end != y.end || x.chunk != y.chunk) return false;
  }
  return true;
}

inline std::string quoted_layout(const Layout& l, const std::vector<std::string>& names) {
  return "\"" + layout_text(l, names) + "\"";
}

/// `t` in layout `need` (the planner's reshard; nothing when it is already there).
template <class T>
RuntimeTensor<T> shape_bring(const RuntimeTensor<T>& t, const Layout& need, const MeshState& mesh,
                             const std::vector<std::string>& axis_names, const std::string& op) {
  if (t.layout == need) return t;
  if (t.partial_op != ReduceOp::sum && !same_partial(t.layout, need))
    throw Error(op, "an operand " + quoted_layout(t.layout, axis_names) +
                        " holds pending max/min partials and would have to change them; finish "
                        "them with reshard first");
  const ReshardPlan plan = plan_reshard(t.layout, need, t.shape, mesh.sizes, mesh.coords,
                                        axis_names, static_cast<std::int64_t>(sizeof(T)));
  RuntimeTensor<T> out{need, shape_in(need, t.layout, t.shape), {}, t.partial_op};
  out.data = ReshardExecutor<T>(plan, mesh, t.partial_op).run(t.data);
  return out;
}

struct LineFrame {
  std::int64_t outer = 1;  // product of the padded local extents before the line's dimensions
  std::int64_t inner = 1;  // ... and after them
};

inline LineFrame line_frame(const Layout& l, const Shape& shape, int first, int last,
                            const std::array<int, max_axes>& sizes) {
  const Shape e = local_extents(l, shape, sizes);
  LineFrame f;
  for (int d = 0; d < first; ++d) f.outer *= e[static_cast<std::size_t>(d)];
  for (int d = last + 1; d < l.rank; ++d) f.inner *= e[static_cast<std::size_t>(d)];
  return f;
}

template <class T>
Kokkos::View<T*> zeros(std::int64_t n) {
  return Kokkos::View<T*>("gshard::shape", static_cast<std::size_t>(n));
}

inline int find_checked(const Layout& l, char label, const std::string& op,
                        const std::vector<std::string>& names) {
  const int d = l.find(label);
  if (d < 0)
    throw Error(op, "label '" + std::string(1, label) + "' is not in the operand's layout " +
                        quoted_layout(l, names));
  return d;
}

/// `src` (lines in blocks `from`, frame `f`) with its lines in blocks `to`: the same view when
/// they coincide, else exchanged.
template <class T>
Kokkos::View<T*> lines_to(const Kokkos::View<T*>& src, const LineBlocks& from, const LineBlocks& to,
                          const LineFrame& f, const MeshState& mesh,
                          const std::vector<std::string>& axis_names) {
  if (lines_coincide(from, to, mesh)) return src;
  const LineSpan mine = span_of(to, mesh.sizes, mesh.coords);
  Kokkos::View<T*> out = zeros<T>(f.outer * mine.chunk * f.inner);
  shape_exchange<T>({LineSource<T>{src.data(), from}}, to, f.outer, f.inner, out.data(), mesh,
                    axis_names);
  return out;
}

/// merge on run-time layouts: `labels` (two or more, major first) become the one label `merged`.
template <class T>
RuntimeTensor<T> merge_runtime(const RuntimeTensor<T>& x, std::string_view labels, char merged,
                               const MeshState& mesh, const std::vector<std::string>& axis_names) {
  const std::string op =
      std::string("merge<\"").append(labels) + "\", \"" + std::string(1, merged) + "\">";
  if (labels.size() < 2 || repeated_at(labels) >= 0)
    throw Error(op, "give two or more distinct labels to merge");
  for (char c : labels) (void)find_checked(x.layout, c, op, axis_names);
  if (x.layout.find(merged) >= 0 && labels.find(merged) == std::string_view::npos)
    throw Error(op,
                "the merged label is already a label of " + quoted_layout(x.layout, axis_names));
  const Layout staging = merge_staging_layout(x.layout, labels);
  const Layout result = merge_layout(x.layout, labels, merged);
  const RuntimeTensor<T> s = shape_bring(x, staging, mesh, axis_names, op);
  const int d = staging.find(labels[0]);
  const int last = d + static_cast<int>(labels.size()) - 1;
  std::int64_t unit = 1;
  for (int i = d + 1; i <= last; ++i) unit *= s.shape[static_cast<std::size_t>(i)];
  const std::int64_t major = s.shape[static_cast<std::size_t>(d)];
  RuntimeTensor<T> out{result, {}, {}, x.partial_op};
  for (int i = 0; i < s.layout.rank; ++i) {
    if (i > d && i <= last) continue;
    out.shape.push_back(i == d ? major * unit : s.shape[static_cast<std::size_t>(i)]);
  }
  const LineBlocks from{staging.dims[d], major, unit, 0, 0, major * unit};
  const LineBlocks to{result.dims[d], major * unit, 1, 0, 0, major * unit};
  // Coinciding lines: the same bytes under the merged label.
  out.data = lines_to<T>(s.data, from, to, line_frame(s.layout, s.shape, d, last, mesh.sizes), mesh,
                         axis_names);
  return out;
}

/// split on run-time layouts: `label` becomes `into` (two or more, major first) of `sizes`.
template <class T>
RuntimeTensor<T> split_runtime(const RuntimeTensor<T>& x, char label, std::string_view into,
                               const Shape& sizes, const MeshState& mesh,
                               const std::vector<std::string>& axis_names) {
  const std::string op =
      std::string("split<\"") + std::string(1, label) + "\", \"" + std::string(into) + "\">";
  const int d = find_checked(x.layout, label, op, axis_names);
  if (into.size() < 2 || repeated_at(into) >= 0)
    throw Error(op, "give two or more distinct labels to split into");
  for (char c : into)
    if (c != label && x.layout.find(c) >= 0)
      throw Error(op, "new label '" + std::string(1, c) + "' is already a label of " +
                          quoted_layout(x.layout, axis_names));
  if (x.layout.rank - 1 + static_cast<int>(into.size()) > max_dims)
    throw Error(op, "the result would have more than 8 dimensions");
  const std::int64_t n = x.shape[static_cast<std::size_t>(d)];
  std::int64_t product_of_sizes = 1;
  bool negative = false;
  for (auto v : sizes) {
    product_of_sizes *= v;
    negative = negative || v < 0;
  }
  if (sizes.size() != into.size() || negative || product_of_sizes != n)
    throw Error(op, "sizes " + shape_string(sizes) + " for \"" + std::string(into) +
                        "\" must be one non-negative size per label, multiplying to the size " +
                        std::to_string(n) + " of '" + std::string(1, label) +
                        "' (operand global shape " + shape_string(x.shape) + ", layout " +
                        quoted_layout(x.layout, axis_names) + ")");
  const Layout result = split_layout(x.layout, label, into);
  RuntimeTensor<T> out{result, {}, {}, x.partial_op};
  for (int i = 0; i < x.layout.rank; ++i) {
    if (i != d) {
      out.shape.push_back(x.shape[static_cast<std::size_t>(i)]);
      continue;
    }
    for (auto v : sizes) out.shape.push_back(v);
  }
  const std::int64_t major = sizes[0];
  std::int64_t minor = 1;
  for (std::size_t i = 1; i < sizes.size(); ++i) minor *= sizes[i];
  const LineBlocks from{x.layout.dims[d], n, 1, 0, 0, n};
  const LineBlocks to{result.dims[d], major, minor, 0, 0, n};
  out.data = lines_to<T>(x.data, from, to, line_frame(x.layout, x.shape, d, d, mesh.sizes), mesh,
                         axis_names);
  return out;
}

/// The box fill_line writes (a namespace-scope type: device lambdas may not capture local ones).
struct FillFrame {
  int rank;
  std::int64_t extent[max_dims];  // the box: valid positions, the filled range along the line
  std::int64_t chunk[max_dims];   // padded local extents
  std::int64_t start[max_dims];   // the box's first local index along each dimension
  std::int64_t stride[max_dims];
};

/// Fills result line positions [a, b) of this rank's block with `value`, where the other
/// dimensions are valid too (their padding stays zero). Skipped on copies other than partial
/// coordinate 0 when the result is a pending sum: the value is counted once.
template <class T>
void fill_line(Kokkos::View<T*> out, const RuntimeTensor<T>& r, const LineBlocks& to, int d,
               std::int64_t a, std::int64_t b, T value, const MeshState& mesh) {
  if (value == T{}) return;
  if (r.partial_op == ReduceOp::sum)
    for (int i = 0; i < r.layout.partial_count; ++i)
      if (mesh.coords[static_cast<std::size_t>(r.layout.partial[i])] != 0) return;
  const LineSpan mine = span_of(to, mesh.sizes, mesh.coords);
  const std::int64_t lo = std::max(a, mine.begin);
  const std::int64_t hi = std::min(b, mine.end);
  if (hi <= lo) return;
  FillFrame f{};
  f.rank = r.layout.rank;
  std::int64_t count = 1;
  for (int i = 0; i < f.rank; ++i) {
    const Block blk =
        block_of(r.layout.dims[i], r.shape[static_cast<std::size_t>(i)], mesh.sizes, mesh.coords);
    f.extent[i] = i == d ? hi - lo : blk.valid;  // only valid positions are visited
    f.start[i] = i == d ? lo - mine.origin : 0;
    f.chunk[i] = blk.chunk;
    count *= f.extent[i];
  }
  std::int64_t s = 1;
  for (int i = f.rank - 1; i >= 0; --i) {
    f.stride[i] = s;
    s *= f.chunk[i];
  }
  T* data = out.data();
  Kokkos::parallel_for(
      "gshard::pad fill", Kokkos::RangePolicy<>(0, count), KOKKOS_LAMBDA(std::int64_t i) {
        std::int64_t at = 0;
        for (int k = f.rank - 1; k >= 0; --k) {
          at += (f.start[k] + i % f.extent[k]) * f.stride[k];
          i /= f.extent[k];
        }
        data[at] = value;
      });
}

/// The shift engine of concat, slice and pad: result line position o along `label` comes from
/// source i's position o - shifts[i] when o is in [begin, end) (the sources' ranges do not
/// overlap); positions [0, fill_lo) and [fill_hi, size) hold `fill`; the result has the
/// sources' (common) layout `result`.
template <class T>
RuntimeTensor<T> shifted_runtime(const std::vector<RuntimeTensor<T>>& xs,
                                 const std::vector<std::int64_t>& shifts, const Layout& result,
                                 char label, std::int64_t begin, std::int64_t end,
                                 std::int64_t size, T fill, std::int64_t fill_lo,
                                 std::int64_t fill_hi, const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  const int d = result.find(label);
  RuntimeTensor<T> out{result, xs[0].shape, {}, xs[0].partial_op};
  out.shape[static_cast<std::size_t>(d)] = size;
  const LineBlocks to{result.dims[d], size, 1, 0, 0, size};
  const LineFrame f = line_frame(result, out.shape, d, d, mesh.sizes);
  const LineSpan mine = span_of(to, mesh.sizes, mesh.coords);
  out.data = zeros<T>(f.outer * mine.chunk * f.inner);
  fill_line(out.data, out, to, d, 0, fill_lo, fill, mesh);
  fill_line(out.data, out, to, d, fill_hi, size, fill, mesh);
  std::vector<LineSource<T>> sources;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::int64_t n = xs[i].shape[static_cast<std::size_t>(d)];
    sources.push_back(
        {xs[i].data.data(), LineBlocks{xs[i].layout.dims[d], n, 1, shifts[i], begin, end}});
  }
  shape_exchange<T>(sources, to, f.outer, f.inner, out.data.data(), mesh, axis_names);
  return out;
}

/// slice on run-time layouts: [begin, end) along `label`; the result keeps the layout.
template <class T>
RuntimeTensor<T> slice_runtime(const RuntimeTensor<T>& x, char label, std::int64_t begin,
                               std::int64_t end, const MeshState& mesh,
                               const std::vector<std::string>& axis_names) {
  const std::string op = std::string("slice<\"") + std::string(1, label) + "\">";
  const int d = find_checked(x.layout, label, op, axis_names);
  const std::int64_t n = x.shape[static_cast<std::size_t>(d)];
  if (begin < 0 || end < begin || end > n)
    throw Error(op, "range [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") is not within [0, " + std::to_string(n) + ") of '" +
                        std::string(1, label) + "' (operand global shape " + shape_string(x.shape) +
                        ", layout " + quoted_layout(x.layout, axis_names) + ")");
  if (begin == 0 && end == n) return x;
  return shifted_runtime<T>({x}, {-begin}, x.layout, label, 0, end - begin, end - begin, T{}, 0, 0,
                            mesh, axis_names);
}

/// pad on run-time layouts: `before` and `after` positions of `value` along `label`.
template <class T>
RuntimeTensor<T> pad_runtime(const RuntimeTensor<T>& x, char label, std::int64_t before,
                             std::int64_t after, T value, const MeshState& mesh,
                             const std::vector<std::string>& axis_names) {
  const std::string op = std::string("pad<\"") + std::string(1, label) + "\">";
  const int d = find_checked(x.layout, label, op, axis_names);
  const std::int64_t n = x.shape[static_cast<std::size_t>(d)];
  if (before < 0 || after < 0)
    throw Error(op, "before " + std::to_string(before) + " and after " + std::to_string(after) +
                        " must not be negative (operand global shape " + shape_string(x.shape) +
                        ", layout " + quoted_layout(x.layout, axis_names) + ")");
  if (before == 0 && after == 0) return x;
  const std::int64_t size = n + before + after;
  return shifted_runtime<T>({x}, {before}, x.layout, label, 0, size, size, value, before,
                            before + n, mesh, axis_names);
}

/// concat on run-time layouts: the operands one after the other along `label`, in the first
/// operand's layout (partial axes: the union).
template <class T>
RuntimeTensor<T> concat_runtime(const std::vector<RuntimeTensor<T>>& xs, char label,
                                const MeshState& mesh, const std::vector<std::string>& axis_names) {
  const std::string op = std::string("concat<\"") + std::string(1, label) + "\">";
  if (xs.empty()) throw Error(op, "no operands");
  const Layout& first = xs[0].layout;
  Layout result = first;
  for (const auto& x : xs) {
    (void)find_checked(x.layout, label, op, axis_names);
    bool same = x.layout.rank == first.rank;
    for (int d = 0; same && d < first.rank; ++d) same = x.layout.find(first.dims[d].label) >= 0;
    bool sizes_agree = same;
    for (int d = 0; sizes_agree && d < first.rank; ++d)
      sizes_agree = first.dims[d].label == label ||
                    xs[0].shape[static_cast<std::size_t>(d)] ==
                        x.shape[static_cast<std::size_t>(x.layout.find(first.dims[d].label))];
    if (!sizes_agree)
      throw Error(op, "operands " + quoted_layout(first, axis_names) + " of global shape " +
                          shape_string(xs[0].shape) + " and " +
                          quoted_layout(x.layout, axis_names) + " of global shape " +
                          shape_string(x.shape) + " differ in labels or in sizes other than '" +
                          std::string(1, label) + "'");
    if (x.partial_op != xs[0].partial_op && (x.layout.partial_count || first.partial_count))
      throw Error(op, "operands hold pending partials of different kinds (sum, max, min)");
    result = concat_layout(result, x.layout);
  }
  std::vector<RuntimeTensor<T>> brought;
  std::vector<std::int64_t> shifts;
  std::int64_t size = 0;
  for (const auto& x : xs) {
    brought.push_back(
        shape_bring(x, concat_operand_layout(result, x.layout, label), mesh, axis_names, op));
    shifts.push_back(size);
    size += x.shape[static_cast<std::size_t>(x.layout.find(label))];
  }
  return shifted_runtime<T>(brought, shifts, result, label, 0, size, size, T{}, 0, 0, mesh,
                            axis_names);
}

template <class T, class MeshT, Layout L>
Sharded<T, MeshT, spec_of<MeshT, L>()> to_sharded(const MeshT& mesh, const RuntimeTensor<T>& r) {
  Sharded<T, MeshT, spec_of<MeshT, L>()> out(mesh, r.shape, r.data);
  detail::set_partial_op(out, r.partial_op);
  detail::set_grad_node(out, r.grad);
  return out;
}

// --- gradients ------------------------------------------------------------------------------
// Every shape op is linear and moves each element at most once, so its backward is the inverse
// move of the cotangent (merge <-> split, slice <-> pad with zeros, concat -> one slice per
// operand) through the same engine: sharded like the forward, no values saved, and correct on a
// cotangent still partial over axes the result does not use.

/// `out` recorded as made by shape op `op` from `inputs` (nothing when none is tracked or the
/// type is not differentiable). A result that is an input's own value (an identity slice or pad)
/// gets its own node, so every result is either recorded or untracked.
template <class T, class MeshT, class Backward>
void record_shape(const MeshT& mesh, RuntimeTensor<T>& out, const std::string& op,
                  std::vector<std::shared_ptr<GradNode>> inputs, Backward backward) {
  out.grad = nullptr;
  if constexpr (differentiable_v<T>) {
    record(mesh, out, op, std::source_location{}, std::move(inputs),
           [b = std::move(backward)](const RuntimeTensor<T>& g) {
             return Cotangents{AnyTensor(b(g))};
           });
  }
}

/// merge's backward: the merged label split back into `labels` of their input `sizes` (layout:
/// the labels adjacent, the first holding the merged label's axes; the driver reshards it).
template <class T>
RuntimeTensor<T> merge_cotangent(const RuntimeTensor<T>& g, std::string_view labels, char merged,
                                 const Shape& sizes, const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  return split_runtime<T>(g, merged, labels, sizes, mesh, axis_names);
}

/// split's backward: the labels `into` merged back into `label`.
template <class T>
RuntimeTensor<T> split_cotangent(const RuntimeTensor<T>& g, char label, std::string_view into,
                                 const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  return merge_runtime<T>(g, into, label, mesh, axis_names);
}

/// concat's backward for one operand: positions [offset, offset + size) of `label`, moved
/// straight into the operand's own split along `label` (as the forward moved it out), the other
/// dimensions as the cotangent has them.
template <class T>
RuntimeTensor<T> concat_cotangent(const RuntimeTensor<T>& g, const Layout& operand, char label,
                                  std::int64_t offset, std::int64_t size, const MeshState& mesh,
                                  const std::vector<std::string>& axis_names) {
  const Layout l = concat_operand_layout(g.layout, operand, label);
  return shifted_runtime<T>({g}, {-offset}, l, label, 0, size, size, T{}, 0, 0, mesh, axis_names);
}

}  // namespace detail

// --- the typed API ------------------------------------------------------------------------------

/// merge<"GS", "T">(x): labels G and S (major first) become one label T of size |G|*|S|.
/// Collective over the mesh.
template <fixed_string Labels, fixed_string Merged, Expression X>
auto merge(const X& x, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "merge");
  if constexpr (!detail::check_merge<Labels, Merged, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    constexpr Layout staging = detail::merge_staging_layout(X::layout, Labels.view());
    constexpr Layout result = detail::merge_layout(X::layout, Labels.view(), Merged.data[0]);
    static_assert(detail::strict_check<MeshT, "merge", 0, X::layout, staging>());
    const std::string op = std::string("merge<\"").append(Labels.view()) + "\">";
    const auto s = detail::materialise_as(x, staging, op);
    const MeshT& mesh = x.mesh();
    auto r = detail::merge_runtime<T>(s, Labels.view(), Merged.data[0], mesh.state(),
                                      detail::axis_name_list<MeshT>());
    Shape sizes;
    for (char c : Labels.view())
      sizes.push_back(s.shape[static_cast<std::size_t>(s.layout.find(c))]);
    const std::string name = std::string("merge<\"").append(Labels.view()) + "\", \"" +
                             std::string(Merged.view()) + "\">";
    detail::record_shape(mesh, r, name, {s.grad}, [mesh, sizes](const detail::RuntimeTensor<T>& g) {
      return detail::merge_cotangent<T>(g, Labels.view(), Merged.data[0], sizes, mesh.state(),
                                        detail::axis_name_list<MeshT>());
    });
    return detail::to_sharded<T, MeshT, result>(mesh, r);
  }
}

/// split<"T", "GS">(x, {g, s}): label T becomes G (major) and S of sizes g and s, g*s = |T|.
/// Collective over the mesh.
template <fixed_string Label, fixed_string Into, Expression X>
auto split(const X& x, const Shape& sizes,
           std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "split");
  if constexpr (!detail::check_split<Label, Into, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    constexpr Layout result = detail::split_layout(X::layout, Label.data[0], Into.view());
    const MeshT& mesh = x.mesh();
    const auto v = detail::materialise(x);
    auto r = detail::split_runtime<T>(v, Label.data[0], Into.view(), sizes, mesh.state(),
                                      detail::axis_name_list<MeshT>());
    detail::record_shape(
        mesh, r,
        std::string("split<\"").append(Label.view()) + "\", \"" + std::string(Into.view()) + "\">",
        {v.grad}, [mesh](const detail::RuntimeTensor<T>& g) {
          return detail::split_cotangent<T>(g, Label.data[0], Into.view(), mesh.state(),
                                            detail::axis_name_list<MeshT>());
        });
    return detail::to_sharded<T, MeshT, result>(mesh, r);
  }
}

/// slice<"S">(x, begin, end): positions [begin, end) along S; the layout is kept. Collective
/// over the mesh when S is split.
template <fixed_string Label, Expression X>
auto slice(const X& x, std::int64_t begin, std::int64_t end,
           std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "slice");
  if constexpr (!detail::check_one_label<Label, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    const MeshT& mesh = x.mesh();
    const auto v = detail::materialise(x);
    auto r = detail::slice_runtime<T>(v, Label.data[0], begin, end, mesh.state(),
                                      detail::axis_name_list<MeshT>());
    const std::int64_t after =
        v.shape[static_cast<std::size_t>(v.layout.find(Label.data[0]))] - end;
    detail::record_shape(mesh, r, std::string("slice<\"").append(Label.view()) + "\">", {v.grad},
                         [mesh, begin, after](const detail::RuntimeTensor<T>& g) {
                           return detail::pad_runtime<T>(g, Label.data[0], begin, after, T{},
                                                         mesh.state(),
                                                         detail::axis_name_list<MeshT>());
                         });
    return detail::to_sharded<T, MeshT, X::layout>(mesh, r);
  }
}

/// pad<"S">(x, before, after, value): `before` positions of `value` ahead of S and `after`
/// behind it; the layout is kept. Collective over the mesh when S is split.
template <fixed_string Label, Expression X>
auto pad(const X& x, std::int64_t before, std::int64_t after,
         typename X::value_type value = typename X::value_type{},
         std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "pad");
  if constexpr (!detail::check_one_label<Label, X>()) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    const MeshT& mesh = x.mesh();
    const auto v = detail::materialise(x);
    auto r = detail::pad_runtime<T>(v, Label.data[0], before, after, value, mesh.state(),
                                    detail::axis_name_list<MeshT>());
    const std::int64_t n = v.shape[static_cast<std::size_t>(v.layout.find(Label.data[0]))];
    // The fill value is a constant: only x gets a gradient.
    detail::record_shape(mesh, r, std::string("pad<\"").append(Label.view()) + "\">", {v.grad},
                         [mesh, before, n](const detail::RuntimeTensor<T>& g) {
                           return detail::slice_runtime<T>(g, Label.data[0], before, before + n,
                                                           mesh.state(),
                                                           detail::axis_name_list<MeshT>());
                         });
    return detail::to_sharded<T, MeshT, X::layout>(mesh, r);
  }
}

namespace detail {

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

/// concat<"S">(a, b, ...): the operands one after the other along S (all other labels of equal
/// size), in the first operand's layout. Collective over the mesh.
template <fixed_string Label, Expression A, Expression... Rest>
requires(sizeof...(Rest) >= 1) auto concat(const A& a, const Rest&... rest) {
  if constexpr (!detail::check_one_label<Label, A>() ||
                !(detail::check_concat_operand<Label, A, Rest>() && ...)) {
    return 0;
  } else {
    using T = typename A::value_type;
    using MeshT = typename A::mesh_type;
    constexpr Layout result = detail::concat_result_layout<A, Rest...>();
    static_assert(detail::concat_all_strict_ok<Label, result, A, Rest...>(
        std::make_index_sequence<1 + sizeof...(Rest)>()));
    const std::string op = std::string("concat<\"").append(Label.view()) + "\">";
    std::vector<detail::RuntimeTensor<T>> xs;
    xs.push_back(detail::materialise_as(
        a, detail::concat_operand_layout(result, A::layout, Label.data[0]), op));
    (xs.push_back(detail::materialise_as(
         rest, detail::concat_operand_layout(result, Rest::layout, Label.data[0]), op)),
     ...);
    const MeshT& mesh = a.mesh();
    auto r =
        detail::concat_runtime<T>(xs, Label.data[0], mesh.state(), detail::axis_name_list<MeshT>());
    if constexpr (detail::differentiable_v<T>) {
      std::vector<std::shared_ptr<detail::GradNode>> inputs;
      std::vector<Layout> layouts;
      std::vector<std::int64_t> sizes;
      for (const auto& t : xs) {
        inputs.push_back(t.grad);
        layouts.push_back(t.layout);
        sizes.push_back(t.shape[static_cast<std::size_t>(t.layout.find(Label.data[0]))]);
      }
      r.grad = nullptr;
      detail::record(mesh, r, op, std::source_location{}, std::move(inputs),
                     [mesh, layouts, sizes](const detail::RuntimeTensor<T>& g) {
                       detail::Cotangents out;
                       std::int64_t offset = 0;
                       for (std::size_t i = 0; i < sizes.size(); ++i) {
                         out.push_back(detail::AnyTensor(detail::concat_cotangent<T>(
                             g, layouts[i], Label.data[0], offset, sizes[i], mesh.state(),
                             detail::axis_name_list<MeshT>())));
                         offset += sizes[i];
                       }
                       return out;
                     });
    }
    return detail::to_sharded<T, MeshT, result>(mesh, r);
  }
}

}  // namespace gshard
