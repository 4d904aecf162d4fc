#pragma once
// The reshard planner: from a source layout to a target layout (same labels) as a short list of
// steps, each one collective on the sub-communicator of the mesh axes it involves, or local.
//
// Order: pending partial sums first (ReduceScatter when the target splits a dimension over
// that axis, else AllReduce: both shrink or keep the data before anything grows it), then the
// split changes (one axis: the collective of GShard's table; anything else: one AllToAllv over
// exactly the axes that change, in which every rank receives only the elements it needs and does
// not hold, so no path goes through full replication), then new partial axes (local).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../comm/counters.hpp"
#include "../core/layout.hpp"
#include "../tensor/geometry.hpp"

namespace gshard {

enum class StepKind {
  reduce_scatter,  // partial over axis -> that axis splits a dimension
  all_reduce,      // partial over axes -> replicated over them
  all_gather,      // one axis stops splitting a dimension
  all_to_all,      // one axis moves from one dimension to another
  permute,         // one axis hands a dimension's split to another axis of the same size
  redistribute,    // any other change of splits: AllToAllv over the changed axes
  local,           // slicing a replicated dimension, or a transpose: no communication
  make_partial,    // replicated -> partial: other copies become zeros (local)
};

inline const char* step_name(StepKind k) {
  switch (k) {
    case StepKind::reduce_scatter:
      return "ReduceScatter";
    case StepKind::all_reduce:
      return "AllReduce";
    case StepKind::all_gather:
      return "AllGather";
    case StepKind::all_to_all:
      return "AllToAll";
    case StepKind::permute:
      return "CollectivePermute";
    case StepKind::redistribute:
      return "AllToAllv";
    case StepKind::local:
      return "local";
    case StepKind::make_partial:
      return "local (partial)";
  }
  return "?";
}

struct ReshardStep {
  StepKind kind = StepKind::local;
  unsigned axes = 0;  // bitmask of the mesh axes it communicates over
  Layout from{};
  Layout to{};
  int from_dim = -1;    // all_gather, all_to_all, reduce_scatter: the dimension of `from` involved
  int to_dim = -1;      // all_to_all: the dimension of `from` the axis moves to
  int other_axis = -1;  // permute: the axis taking over
  std::int64_t bytes = 0;  // sent by this rank (comm/counters.hpp), as the counters will show
};

struct ReshardPlan {
  Layout source{};
  Layout target{};
  Shape shape;  // global shape in source label order
  std::vector<std::string> axis_names;
  std::vector<ReshardStep> steps;

  [[nodiscard]] std::int64_t bytes() const {
    std::int64_t b = 0;
    for (const auto& s : steps) b += s.bytes;
    return b;
  }
};

namespace detail {

/// Global shape in the label order of `layout`, from the source's order.
inline Shape shape_in(const Layout& layout, const Layout& source, const Shape& source_shape) {
  Shape out(static_cast<std::size_t>(layout.rank));
  for (int d = 0; d < layout.rank; ++d)
    out[static_cast<std::size_t>(d)] =
        source_shape[static_cast<std::size_t>(source.find(layout.dims[d].label))];
  return out;
}

inline std::string axes_string(unsigned mask, const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t a = 0; a < names.size(); ++a)
    if (mask & (1u << a)) s.append(s.empty() ? "" : "*").append(names[a]);
  return s.empty() ? "none" : s;
}

inline int group_size_of(unsigned mask, const std::array<int, max_axes>& sizes) {
  int k = 1;
  for (int a = 0; a < max_axes; ++a)
    if (mask & (1u << a)) k *= sizes[static_cast<std::size_t>(a)];
  return k;
}

/// Splitting blocks of ceil(N/k) into k_more equal sub-blocks gives exactly the blocks of
/// ceil(N/(k*k_more)) (always true when sizes divide evenly; not always for uneven ones).
inline bool nests(std::int64_t n, std::int64_t k, std::int64_t k_more) {
  return ceil_div(n, k) == k_more * ceil_div(n, k * k_more);
}

inline Layout without_partial(Layout l, int axis) {
  int w = 0;
  for (int i = 0; i < l.partial_count; ++i)
    if (l.partial[i] != axis) l.partial[w++] = l.partial[i];
  l.partial_count = w;
  return l;
}

inline Layout with_minor_axis(Layout l, int dim, int axis) {
  DimLayout& d = l.dims[dim];
  d.axes[d.axis_count++] = axis;
  return l;
}

inline Layout without_minor_axis(Layout l, int dim) {
  l.dims[dim].axis_count -= 1;
  return l;
}

inline bool same_order(const Layout& a, const Layout& b) {
  for (int d = 0; d < a.rank; ++d)
    if (a.dims[d].label != b.dims[d].label) return false;
  return true;
}

/// `b` with its dimensions in the order of `a` (labels equal as sets).
inline Layout reordered_like(const Layout& b, const Layout& a) {
  Layout out = b;
  for (int d = 0; d < a.rank; ++d) out.dims[d] = b.dims[b.find(a.dims[d].label)];
  return out;
}

inline bool same_axes(const DimLayout& a, const DimLayout& b) {
  if (a.axis_count != b.axis_count) return false;
  for (int i = 0; i < a.axis_count; ++i)
    if (a.axes[i] != b.axes[i]) return false;
  return true;
}

/// The coordinates of member j of the group over `mask` that contains `me`.
inline Coords member_coords(Coords me, unsigned mask, int j, const std::array<int, max_axes>& sizes,
                            int axis_count) {
  for (int a = axis_count - 1; a >= 0; --a) {
    if (!(mask & (1u << a))) continue;
    const auto au = static_cast<std::size_t>(a);
    me[au] = j % sizes[au];
    j /= sizes[au];
  }
  return me;
}

/// A box of global indices, per dimension of the destination layout.
struct Box {
  int rank = 0;
  std::int64_t start[max_dims]{};
  std::int64_t length[max_dims]{};
  [[nodiscard]] std::int64_t volume() const {
    std::int64_t v = 1;
    for (int d = 0; d < rank; ++d) v *= length[d];
    return v;
  }
};

/// What the rank at `holder` has under `from` and the rank at `receiver` needs under `to`.
inline Box overlap(const Layout& from, const Layout& to, const Shape& to_shape,
                   const std::array<int, max_axes>& sizes, const Coords& holder,
                   const Coords& receiver) {
  Box box;
  box.rank = to.rank;
  for (int t = 0; t < to.rank; ++t) {
    const std::int64_t n = to_shape[static_cast<std::size_t>(t)];
    const Block need = block_of(to.dims[t], n, sizes, receiver);
    const Block have = block_of(from.dims[from.find(to.dims[t].label)], n, sizes, holder);
    const std::int64_t lo = std::max(need.offset, have.offset);
    const std::int64_t hi = std::min(need.offset + need.valid, have.offset + have.valid);
    box.start[t] = lo;
    box.length[t] = std::max<std::int64_t>(0, hi - lo);
  }
  return box;
}

/// In an exchange over `mask`, the holder that serves `receiver` an element: among the ranks
/// holding it, the one agreeing with the receiver on every axis of `mask` that replicates
/// `from` (so the load spreads evenly, and a rank holding an element serves itself).
inline bool serves(const Layout& from, unsigned mask, const Coords& holder, const Coords& receiver,
                   int axis_count) {
  for (int a = 0; a < axis_count; ++a) {
    if (!(mask & (1u << a)) || from.dim_on_axis(a) >= 0) continue;
    if (holder[static_cast<std::size_t>(a)] != receiver[static_cast<std::size_t>(a)]) return false;
  }
  return true;
}

/// Elements this rank sends to the other members of the exchange over `mask`.
inline std::int64_t redistribute_send_elements(const Layout& from, const Layout& to,
                                               const Shape& to_shape,
                                               const std::array<int, max_axes>& sizes,
                                               const Coords& me, unsigned mask, int axis_count) {
  const int k = group_size_of(mask, sizes);
  std::int64_t total = 0;
  for (int j = 0; j < k; ++j) {
    const Coords other = member_coords(me, mask, j, sizes, axis_count);
    if (other == me || !serves(from, mask, me, other, axis_count)) continue;
    total += overlap(from, to, to_shape, sizes, me, other).volume();
  }
  return total;
}

constexpr unsigned axes_of(const DimLayout& d) {
  unsigned m = 0;
  for (int i = 0; i < d.axis_count; ++i) m |= 1u << d.axes[i];
  return m;
}

constexpr unsigned partial_mask(const Layout& l) {
  unsigned m = 0;
  for (int i = 0; i < l.partial_count; ++i) m |= 1u << l.partial[i];
  return m;
}

inline Layout with_partials(Layout l, unsigned mask, int axis_count) {
  l.partial_count = 0;
  for (int a = 0; a < axis_count; ++a)
    if (mask & (1u << a)) l.partial[l.partial_count++] = a;
  return l;
}

/// Plans source -> target for a tensor of global shape `shape` (source label order) on a mesh
/// with the given axis sizes; `me` are this rank's coordinates (for its byte counts).
inline ReshardPlan plan_reshard(const Layout& source, const Layout& target, const Shape& shape,
                                const std::array<int, max_axes>& sizes, const Coords& me,
                                std::vector<std::string> axis_names, std::int64_t element_bytes) {
  const int axis_count = static_cast<int>(axis_names.size());
  ReshardPlan plan{source, target, shape, std::move(axis_names), {}};
  auto local_elements = [&](const Layout& l) {
    return product(local_extents(l, shape_in(l, source, shape), sizes));
  };
  auto size_of = [&](const Layout& l, int d) {
    return shape[static_cast<std::size_t>(source.find(l.dims[d].label))];
  };
  Layout cur = source;
  auto push = [&](StepKind kind, unsigned axes, const Layout& to,
                  std::int64_t bytes) -> ReshardStep& {
    // Over axes of size 1 nothing moves: the step is a local copy.
    if (axes != 0 && group_size_of(axes, sizes) == 1) {
      kind = StepKind::local;
      axes = 0;
      bytes = 0;
    }
    plan.steps.push_back(ReshardStep{kind, axes, cur, to, -1, -1, -1, bytes});
    cur = to;
    return plan.steps.back();
  };

  // 1. Pending partial sums the target does not keep.
  const unsigned kept_partial = partial_mask(source) & partial_mask(target);
  unsigned reduce = 0;
  for (int i = 0; i < source.partial_count; ++i) {
    const int a = source.partial[i];
    if (kept_partial & (1u << a)) continue;
    const int td = target.dim_on_axis(a);
    if (td >= 0) {
      const int cd = cur.find(target.dims[td].label);
      const int k = shard_count(cur.dims[cd], sizes);
      const int ka = sizes[static_cast<std::size_t>(a)];
      if (k == 1 || nests(size_of(cur, cd), k, ka)) {
        const Layout to = with_minor_axis(without_partial(cur, a), cd, a);
        const std::int64_t n = local_elements(to);
        push(StepKind::reduce_scatter, 1u << a, to, (ka - 1) * n * element_bytes).from_dim = cd;
        continue;
      }
    }
    reduce |= 1u << a;
  }
  if (reduce != 0) {
    const int k = group_size_of(reduce, sizes);
    const std::int64_t n = local_elements(cur);
    push(StepKind::all_reduce, reduce, with_partials(cur, partial_mask(cur) & ~reduce, axis_count),
         2 * (k - 1) * n * element_bytes / k);
  }

  // 2. Splits. The goal is the target without its new partial axes (replicated until step 3).
  const Layout goal = with_partials(target, partial_mask(cur), axis_count);
  const Layout g = reordered_like(goal, cur);  // the goal in the current dimension order
  int changed[max_dims];
  int changed_count = 0;
  for (int d = 0; d < cur.rank; ++d)
    if (!same_axes(cur.dims[d], g.dims[d])) changed[changed_count++] = d;

  if (changed_count > 0) {
    // Single-axis moves of GShard's table, when the blocks line up exactly.
    auto minor_removed = [&](int d) {  // g's list = cur's list minus its minor axis
      const DimLayout& c = cur.dims[d];
      return c.axis_count == g.dims[d].axis_count + 1 &&
             same_axes(without_minor_axis(cur, d).dims[d], g.dims[d]);
    };
    auto minor_added = [&](int d) {
      const DimLayout& x = g.dims[d];
      return x.axis_count == cur.dims[d].axis_count + 1 &&
             same_axes(without_minor_axis(g, d).dims[d], cur.dims[d]);
    };
    auto lines_up = [&](const DimLayout& shorter, int d, int axis) {
      const int k = shard_count(shorter, sizes);
      return k == 1 || nests(size_of(cur, d), k, sizes[static_cast<std::size_t>(axis)]);
    };
    bool done = false;
    if (changed_count == 1) {
      const int d = changed[0];
      if (minor_removed(d)) {
        const int a = cur.dims[d].axes[cur.dims[d].axis_count - 1];
        if (lines_up(g.dims[d], d, a)) {
          const int ka = sizes[static_cast<std::size_t>(a)];
          push(StepKind::all_gather, 1u << a, g, (ka - 1) * local_elements(cur) * element_bytes)
              .from_dim = d;
          done = true;
        }
      } else if (minor_added(d)) {
        const int a = g.dims[d].axes[g.dims[d].axis_count - 1];
        if (cur.dim_on_axis(a) < 0 && lines_up(cur.dims[d], d, a)) {
          push(StepKind::local, 0, g, 0);
          done = true;
        }
      } else if (cur.dims[d].axis_count == g.dims[d].axis_count) {
        // One axis replaced by another of the same size at the same position.
        int diff = 0;
        int at = -1;
        for (int i = 0; i < cur.dims[d].axis_count; ++i)
          if (cur.dims[d].axes[i] != g.dims[d].axes[i]) {
            ++diff;
            at = i;
          }
        if (diff == 1) {
          const int a = cur.dims[d].axes[at];
          const int b = g.dims[d].axes[at];
          if (cur.dim_on_axis(b) < 0 && g.dim_on_axis(a) < 0 &&
              sizes[static_cast<std::size_t>(a)] == sizes[static_cast<std::size_t>(b)]) {
            const bool stays = me[static_cast<std::size_t>(a)] == me[static_cast<std::size_t>(b)];
            push(StepKind::permute, (1u << a) | (1u << b), g,
                 stays ? 0 : local_elements(cur) * element_bytes)
                .other_axis = b;
            done = true;
          }
        }
      }
    } else if (changed_count == 2) {
      // An axis leaving one dimension's minor end for another's: AllToAll.
      for (int pass = 0; pass < 2 && !done; ++pass) {
        const int x = changed[pass];
        const int y = changed[1 - pass];
        if (!minor_removed(x) || !minor_added(y)) continue;
        const int a = cur.dims[x].axes[cur.dims[x].axis_count - 1];
        if (g.dims[y].axes[g.dims[y].axis_count - 1] != a) continue;
        if (!lines_up(g.dims[x], x, a) || !lines_up(cur.dims[y], y, a)) continue;
        const int ka = sizes[static_cast<std::size_t>(a)];
        // What goes to each member: the local block with y cut to its new (padded) block.
        Shape piece = local_extents(cur, shape_in(cur, source, shape), sizes);
        piece[static_cast<std::size_t>(y)] =
            ceil_div(size_of(cur, y), shard_count(g.dims[y], sizes));
        ReshardStep& s =
            push(StepKind::all_to_all, 1u << a, g, (ka - 1) * product(piece) * element_bytes);
        s.from_dim = x;
        s.to_dim = y;
        done = true;
      }
    }
    if (!done) {
      unsigned mask = 0;
      for (int i = 0; i < changed_count; ++i)
        mask |= axes_of(cur.dims[changed[i]]) | axes_of(g.dims[changed[i]]);
      const std::int64_t elements = redistribute_send_elements(
          cur, goal, shape_in(goal, source, shape), sizes, me, mask, axis_count);
      push(StepKind::redistribute, mask, goal, elements * element_bytes);
    }
  }
  if (!same_order(cur, goal)) push(StepKind::local, 0, reordered_like(cur, goal), 0);

  // 3. New partial axes: the other copies become zeros.
  if (partial_mask(target) != partial_mask(cur)) push(StepKind::make_partial, 0, target, 0);
  return plan;
}

}  // namespace detail
}  // namespace gshard
