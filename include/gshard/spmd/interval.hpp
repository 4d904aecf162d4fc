#pragma once
// The interval exchange of the shape ops (ops/shape.hpp): along one dimension of the result,
// every rank knows from the block arithmetic alone which interval each member of the group over
// the dimension's axes holds and needs; local pieces are copied, the rest moves in ONE AllToAllv
// (spmd/exchange.hpp, the path reshard takes) over those axes.
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "../kernels/copy_box.hpp"
#include "../tensor/sharded.hpp"
#include "exchange.hpp"
#include "plan.hpp"

namespace gshard {
namespace detail {

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
/// the rest in one AllToAllv (spmd/exchange.hpp) over the axes of the line (skipped, on every rank
/// alike, when no piece crosses ranks anywhere: the pieces depend only on coordinates within the
/// group, so every group has the same pattern). Elements of `out` no source covers are left as they
/// are.
template <class T>
void interval_exchange(const std::vector<LineSource<T>>& sources, const LineBlocks& dest,
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
  AllToAllvCounts counts(k);
  for (int j = 0; j < k; ++j) {
    std::int64_t sent = 0;
    std::int64_t received = 0;
    if (j != me)
      for (std::size_t s = 0; s < sources.size(); ++s) {
        const Piece out_piece = piece(s, me, j);
        const Piece in_piece = piece(s, j, me);
        sent += (out_piece.end - out_piece.begin) * slab;
        received += (in_piece.end - in_piece.begin) * slab;
      }
    counts.add(j, sent, received, "shape op AllToAllv");
  }
  all_to_all_v_staged<T>(
      counts, mesh.groups[mask], axes_string(mask, axis_names),
      [&](T* send) {
        std::int64_t at = 0;
        for (int j = 0; j < k; ++j) {
          if (j == me) continue;
          for (std::size_t s = 0; s < sources.size(); ++s) {
            const Piece p = piece(s, me, j);
            const std::int64_t len = p.end - p.begin;
            if (len <= 0) continue;
            const LineSpan have = span_of(sources[s].line, mesh.sizes, mesh.coords);
            copy_box(sources[s].data, send + at,
                     line_box(outer, inner, len, have.chunk, p.begin - have.origin, len, 0));
            at += len * slab;
          }
        }
      },
      [&](const T* recv) {
        std::int64_t at = 0;
        for (int j = 0; j < k; ++j) {
          if (j == me) continue;
          for (std::size_t s = 0; s < sources.size(); ++s) {
            const Piece p = piece(s, j, me);
            const std::int64_t len = p.end - p.begin;
            if (len <= 0) continue;
            copy_box(recv + at, out,
                     line_box(outer, inner, len, len, 0, mine.chunk, p.begin - mine.origin));
            at += len * slab;
          }
        }
      });
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

}  // namespace detail
}  // namespace gshard
