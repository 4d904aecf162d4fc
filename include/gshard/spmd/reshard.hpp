#pragma once
// Executing a reshard plan (spmd/plan.hpp) on a tensor's local shard, and the public entry
// points: reshard<Target>(t), plan_reshard<Target>(t), explain(plan).
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <source_location>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "../comm/collectives.hpp"
#include "../comm/mpi_access.hpp"
#include "../kernels/copy_box.hpp"
#include "../tensor/sharded.hpp"
#include "exchange.hpp"
#include "plan.hpp"

namespace gshard {

namespace detail {

/// Results of resharding and einsums, recycled: a result the caller has dropped (the cache holds
/// its only reference) is handed out again for the next result of the same size, so
/// `y = reshard<L>(x)` or `c = einsum(a, b)` in a loop stops allocating (and first-touching)
/// after two iterations. Small results and results nobody dropped take a fresh allocation. Holds
/// at most `slots` dropped results; all are released when Kokkos finalises. The contents are
/// undefined: callers write every element.
template <class T>
Kokkos::View<T*> recycled_result(std::int64_t n, const char* label = "gshard::reshard") {
  constexpr std::size_t slots = 8;
  constexpr std::int64_t min_bytes = std::int64_t{256} << 10;
  static std::vector<Kokkos::View<T*>> cache;
  static const bool hooked = [] {
    Kokkos::push_finalize_hook([] { cache.clear(); });
    return true;
  }();
  (void)hooked;
  if (n * static_cast<std::int64_t>(sizeof(T)) >= min_bytes)
    for (const Kokkos::View<T*>& v : cache)
      if (v.use_count() == 1 && static_cast<std::int64_t>(v.extent(0)) == n) return v;
  Kokkos::View<T*> fresh(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), n);
  advise_huge_pages(fresh);
  if (n * static_cast<std::int64_t>(sizeof(T)) < min_bytes) return fresh;
  if (cache.size() >= slots) {  // forget a dropped one (freeing it), or do not cache
    auto dropped = std::find_if(cache.begin(), cache.end(),
                                [](const Kokkos::View<T*>& v) { return v.use_count() == 1; });
    if (dropped == cache.end()) return fresh;
    cache.erase(dropped);
  }
  cache.push_back(fresh);
  return fresh;
}

/// Copies `box` (global indices, per dim of `to`) from a block under `from` held at
/// `from_origin` (global offsets per dim of `from`) into a block under `to` at `to_origin`.
struct BoxEnds {
  const Layout* layout;
  Shape extent;  // padded local extents
  Shape origin;  // global offset of the block's first element, per dim
};

inline BoxCopy box_copy(const Box& box, const Layout& from, const BoxEnds& src, const Layout& to,
                        const BoxEnds& dst) {
  BoxCopy c;
  c.rank = to.rank;
  std::int64_t src_stride[max_dims];
  std::int64_t dst_stride[max_dims];
  row_major_strides(from.rank, src.extent.data(), src_stride);
  row_major_strides(to.rank, dst.extent.data(), dst_stride);
  for (int t = 0; t < to.rank; ++t) {
    const int s = from.find(to.dims[t].label);
    const auto tu = static_cast<std::size_t>(t);
    const auto su = static_cast<std::size_t>(s);
    c.box[t] = box.length[t];
    c.dst_start[t] = box.start[t] - dst.origin[tu];
    c.dst_stride[t] = dst_stride[t];
    c.src_start[t] = box.start[t] - src.origin[su];
    c.src_stride[t] = src_stride[s];
  }
  return c;
}

/// Local extents and global offsets of the block at `c` under `l`.
inline BoxEnds block_ends(const Layout& l, const Shape& shape,
                          const std::array<int, max_axes>& sizes, const Coords& c) {
  BoxEnds e{&l, Shape(static_cast<std::size_t>(l.rank)), Shape(static_cast<std::size_t>(l.rank))};
  for (int d = 0; d < l.rank; ++d) {
    const Block b = block_of(l.dims[d], shape[static_cast<std::size_t>(d)], sizes, c);
    e.extent[static_cast<std::size_t>(d)] = b.chunk;
    e.origin[static_cast<std::size_t>(d)] = b.offset;
  }
  return e;
}

/// Runs a plan. `mesh` is the runtime state; `names` the mesh's axis names.
template <class T>
class ReshardExecutor {
 public:
  ReshardExecutor(const ReshardPlan& plan, const MeshState& mesh, ReduceOp op)
      : plan_(plan), mesh_(mesh), op_(op) {}

  /// Runs every step; the last one writes into `final_out` when given (its size must be the
  /// target's local size), so a caller can reuse a tensor's storage.
  Kokkos::View<T*> run(Kokkos::View<T*> data, Kokkos::View<T*> final_out = {}) const {
    const TraceContext context([&] {
      std::array<std::string_view, max_axes> names{};
      for (std::size_t i = 0; i < plan_.axis_names.size(); ++i) names[i] = plan_.axis_names[i];
      return "reshard \"" + layout_string(plan_.source, names) + "\" -> \"" +
             layout_string(plan_.target, names) + "\" " + shape_string(plan_.shape);
    });
    for (std::size_t i = 0; i < plan_.steps.size(); ++i) {
      out_ = i + 1 == plan_.steps.size() ? final_out : Kokkos::View<T*>();
      data = run_step(plan_.steps[i], data);
    }
    out_ = {};
    return data;
  }

 private:
  Shape shape_of(const Layout& l) const { return shape_in(l, plan_.source, plan_.shape); }
  std::int64_t local_elements(const Layout& l) const {
    return product(local_extents(l, shape_of(l), mesh_.sizes));
  }
  std::string axes(unsigned mask) const { return axes_string(mask, plan_.axis_names); }
  MPI_Comm group(unsigned mask) const { return mask == 0 ? MPI_COMM_SELF : mesh_.groups[mask]; }
  // The step's output: the caller's buffer on the last step, else a new one. `overwritten`
  // says the step writes every element (padding included), so no zero fill is needed.
  Kokkos::View<T*> output(const Layout& l, bool overwritten) const {
    const std::int64_t n = local_elements(l);
    if (out_.data() != nullptr && static_cast<std::int64_t>(out_.extent(0)) == n) {
      if (!overwritten) Kokkos::deep_copy(out_, T{});
      return out_;
    }
    Kokkos::View<T*> fresh = recycled_result<T>(n);
    if (!overwritten) Kokkos::deep_copy(fresh, T{});
    return fresh;
  }
  // Staging buffer `slot` (0: send, 1: receive), not initialised, reused between calls.
  static Kokkos::View<T*> scratch(std::int64_t n, int slot) { return workspace<T>(slot, n); }

  Kokkos::View<T*> run_step(const ReshardStep& s, const Kokkos::View<T*>& in) const {
    switch (s.kind) {
      case StepKind::all_reduce:
        return all_reduce_step(s, in);
      case StepKind::reduce_scatter:
        return reduce_scatter_step(s, in);
      case StepKind::all_gather:
        return all_gather_step(s, in);
      case StepKind::all_to_all:
        return all_to_all_step(s, in);
      case StepKind::permute:
        return permute_step(s, in);
      case StepKind::redistribute:
      case StepKind::local:
        return redistribute(s.from, s.to, s.axes, in);
      case StepKind::make_partial:
        return make_partial_step(s, in);
    }
    return in;
  }

  Kokkos::View<T*> all_reduce_step(const ReshardStep& s, const Kokkos::View<T*>& in) const {
    Kokkos::View<T*> out = output(s.to, true);
    MpiAccess<T> src(in, true);
    MpiAccess<T> dst(out, false);
    const int k = group_size_of(s.axes, mesh_.sizes);
    const std::int64_t n = static_cast<std::int64_t>(in.extent(0));
    TraceSpan span("collective", "AllReduce");
    const CollectiveWatch watch("AllReduce", axes(s.axes), group(s.axes));
    check_mpi(MPI_Allreduce(src.data(), dst.data(), mpi_count(n, "AllReduce"), mpi_type<T>(),
                            mpi_op(op_), group(s.axes)),
              "AllReduce");
    counted(span, axes(s.axes), Collective::all_reduce,
            2 * (k - 1) * n * std::int64_t{sizeof(T)} / k);
    dst.copy_out();
    return out;
  }

  // Cuts dimension `d` of the block under `from` into k pieces of the block under `to` (each
  // padded to to's chunk) laid one after another: piece j is what group member j gets.
  void pack_pieces(const Layout& from, const Layout& to, int d, int k, const T* src, T* dst) const {
    const Shape from_shape = shape_of(from);
    Shape from_ext = local_extents(from, from_shape, mesh_.sizes);
    Shape piece_ext = from_ext;
    const std::int64_t chunk =
        ceil_div(from_shape[static_cast<std::size_t>(d)], shard_count(to.dims[d], mesh_.sizes));
    piece_ext[static_cast<std::size_t>(d)] = chunk;
    const std::int64_t piece = product(piece_ext);
    for (int j = 0; j < k; ++j) {
      BoxCopy c;
      c.rank = from.rank;
      row_major_strides(from.rank, from_ext.data(), c.src_stride);
      row_major_strides(from.rank, piece_ext.data(), c.dst_stride);
      for (int t = 0; t < from.rank; ++t) c.box[t] = from_ext[static_cast<std::size_t>(t)];
      const std::int64_t begin = j * chunk;
      c.box[d] = std::clamp<std::int64_t>(from_ext[static_cast<std::size_t>(d)] - begin, 0, chunk);
      c.src_start[d] = begin;
      copy_box(src, dst + j * piece, c);
    }
  }

  // Places k pieces (each a block under `from`) side by side along dimension `d` of the block
  // under `to`, cutting what falls beyond to's chunk (padding only).
  void unpack_pieces(const Layout& from, const Layout& to, int d, int k, const T* src,
                     T* dst) const {
    Shape piece_ext = local_extents(from, shape_of(from), mesh_.sizes);
    Shape to_ext = local_extents(to, shape_of(to), mesh_.sizes);
    const std::int64_t piece = product(piece_ext);
    const std::int64_t chunk = piece_ext[static_cast<std::size_t>(d)];
    for (int j = 0; j < k; ++j) {
      BoxCopy c;
      c.rank = to.rank;
      row_major_strides(to.rank, piece_ext.data(), c.src_stride);
      row_major_strides(to.rank, to_ext.data(), c.dst_stride);
      for (int t = 0; t < to.rank; ++t) c.box[t] = piece_ext[static_cast<std::size_t>(t)];
      const std::int64_t begin = j * chunk;
      c.box[d] = std::clamp<std::int64_t>(to_ext[static_cast<std::size_t>(d)] - begin, 0, chunk);
      c.dst_start[d] = begin;
      copy_box(src + j * piece, dst, c);
    }
  }

  // True when pieces along `d` are contiguous in row-major order: every earlier extent is 1.
  static bool outermost(const Shape& extents, int d) {
    for (int t = 0; t < d; ++t)
      if (extents[static_cast<std::size_t>(t)] != 1) return false;
    return true;
  }

  // True when pack_pieces(from, to, d, k) writes every element of its k pieces.
  bool pieces_cover(const Layout& from, const Layout& to, int d, int k) const {
    const Shape from_shape = shape_of(from);
    const std::int64_t chunk =
        ceil_div(from_shape[static_cast<std::size_t>(d)], shard_count(to.dims[d], mesh_.sizes));
    return k * chunk == local_extents(from, from_shape, mesh_.sizes)[static_cast<std::size_t>(d)];
  }

  Kokkos::View<T*> reduce_scatter_step(const ReshardStep& s, const Kokkos::View<T*>& in) const {
    const int k = group_size_of(s.axes, mesh_.sizes);
    Kokkos::View<T*> out = output(s.to, true);
    const std::int64_t n = static_cast<std::int64_t>(out.extent(0));
    Kokkos::View<T*> send = in;
    if (!(static_cast<std::int64_t>(in.extent(0)) == k * n &&
          outermost(local_extents(s.from, shape_of(s.from), mesh_.sizes), s.from_dim))) {
      send = scratch(k * n, 0);
      if (!pieces_cover(s.from, s.to, s.from_dim, k)) Kokkos::deep_copy(send, T{});
      pack_pieces(s.from, s.to, s.from_dim, k, in.data(), send.data());
    }
    MpiAccess<T> src(send, true);
    MpiAccess<T> dst(out, false);
    reduce_scatter(src.data(), dst.data(), n, op_, group(s.axes), axes(s.axes));
    dst.copy_out();
    return out;
  }

  Kokkos::View<T*> all_gather_step(const ReshardStep& s, const Kokkos::View<T*>& in) const {
    const int k = group_size_of(s.axes, mesh_.sizes);
    const std::int64_t n = static_cast<std::int64_t>(in.extent(0));
    const bool direct = local_elements(s.to) == k * n &&
                        outermost(local_extents(s.from, shape_of(s.from), mesh_.sizes), s.from_dim);
    // The pieces tile the target block (their padding holds zeros): no zero fill either way.
    Kokkos::View<T*> out = output(s.to, true);
    Kokkos::View<T*> recv = direct ? out : scratch(k * n, 1);
    MpiAccess<T> src(in, true);
    MpiAccess<T> dst(recv, false);
    all_gather(src.data(), dst.data(), n, group(s.axes), axes(s.axes));
    dst.copy_out();
    if (!direct) unpack_pieces(s.from, s.to, s.from_dim, k, recv.data(), out.data());
    return out;
  }

  Kokkos::View<T*> all_to_all_step(const ReshardStep& s, const Kokkos::View<T*>& in) const {
    const int k = group_size_of(s.axes, mesh_.sizes);
    const auto x = static_cast<std::size_t>(s.from_dim);
    const auto y = static_cast<std::size_t>(s.to_dim);
    const Shape from_ext = local_extents(s.from, shape_of(s.from), mesh_.sizes);
    const Shape to_ext = local_extents(s.to, shape_of(s.to), mesh_.sizes);
    // The received pieces tile the target block (their padding holds zeros): no zero fill.
    Kokkos::View<T*> out = output(s.to, true);
    // Pieces: the local block cut along the receiving dim (y) to the target's chunk.
    Shape piece_ext = from_ext;
    piece_ext[y] = ceil_div(shape_of(s.from)[y], shard_count(s.to.dims[s.to_dim], mesh_.sizes));
    const std::int64_t piece = product(piece_ext);
    // Zero-copy sides, as a hand-written program does: when y is the outermost dimension of
    // the source block the pieces are consecutive slices of it; when x is the outermost
    // dimension of the target block the received pieces are consecutive slices of it.
    const bool send_direct = k * piece_ext[y] == from_ext[y] && outermost(from_ext, s.to_dim);
    const bool recv_direct = k * from_ext[x] == to_ext[x] && outermost(to_ext, s.from_dim) &&
                             static_cast<std::int64_t>(out.extent(0)) == k * piece;
    Kokkos::View<T*> send = in;
    if (!send_direct) {
      send = scratch(k * piece, 0);
      if (k * piece_ext[y] != from_ext[y]) Kokkos::deep_copy(send, T{});
      pack_pieces(s.from, s.to, s.to_dim, k, in.data(), send.data());
    }
    Kokkos::View<T*> recv = recv_direct ? out : scratch(k * piece, 1);
    {
      MpiAccess<T> src(send, true);
      MpiAccess<T> dst(recv, false);
      all_to_all(src.data(), dst.data(), piece, group(s.axes), axes(s.axes));
      dst.copy_out();
    }
    if (!recv_direct) {
      // Received pieces are blocks of a layout where y already has the axis and x still has it.
      Layout mid = s.to;
      mid.dims[s.from_dim] = s.from.dims[s.from_dim];
      unpack_pieces(mid, s.to, s.from_dim, k, recv.data(), out.data());
    }
    return out;
  }

  Kokkos::View<T*> permute_step(const ReshardStep& s, const Kokkos::View<T*>& in) const {
    // The axis splitting the dimension changes from a to b (same size): swapping the two
    // coordinates gives the partner, who holds what this rank needs and needs what it holds.
    int a = -1;
    for (int x = 0; x < max_axes; ++x)
      if ((s.axes & (1u << x)) && x != s.other_axis) a = x;
    const int b = s.other_axis;
    Coords partner = mesh_.coords;
    std::swap(partner[static_cast<std::size_t>(a)], partner[static_cast<std::size_t>(b)]);
    // Group rank: row-major over the group's axes, in mesh order.
    int partner_rank = 0;
    for (int x = 0; x < mesh_.axis_count; ++x)
      if (s.axes & (1u << x))
        partner_rank = partner_rank * mesh_.sizes[static_cast<std::size_t>(x)] +
                       partner[static_cast<std::size_t>(x)];
    Kokkos::View<T*> out = output(s.to, true);
    MpiAccess<T> src(in, true);
    MpiAccess<T> dst(out, false);
    permute(src.data(), dst.data(), static_cast<std::int64_t>(in.extent(0)), partner_rank,
            partner_rank, group(s.axes), axes(s.axes));
    dst.copy_out();
    return out;
  }

  Kokkos::View<T*> make_partial_step(const ReshardStep& s, const Kokkos::View<T*>& in) const {
    bool keeps = true;
    for (int i = 0; i < s.to.partial_count; ++i) {
      const int a = s.to.partial[i];
      if (!s.from.is_partial(a) && mesh_.coords[static_cast<std::size_t>(a)] != 0) keeps = false;
    }
    Kokkos::View<T*> out = output(s.to, false);
    // Max and min are idempotent: every copy may keep the value. Sums keep one copy.
    if (keeps || op_ != ReduceOp::sum) Kokkos::deep_copy(out, in);
    return out;
  }

  // Any change of splits (and of dimension order) by one AllToAllv over the axes in `mask`;
  // with mask 0 it is a local slice or transpose.
  Kokkos::View<T*> redistribute(const Layout& from, const Layout& to, unsigned mask,
                                const Kokkos::View<T*>& in) const {
    const auto& sizes = mesh_.sizes;
    const Coords& me = mesh_.coords;
    const Shape from_shape = shape_of(from);
    const Shape to_shape = shape_of(to);
    const BoxEnds mine_from = block_ends(from, from_shape, sizes, me);
    const BoxEnds mine_to = block_ends(to, to_shape, sizes, me);
    // What this rank keeps. When that is the whole block (a local slice without padding),
    // nothing else writes the result, so it needs no zero fill.
    const Box keep = overlap(from, to, to_shape, sizes, me, me);
    Kokkos::View<T*> out = output(to, mask == 0 && keep.volume() == local_elements(to));
    if (keep.volume() > 0)
      copy_box(in.data(), out.data(), box_copy(keep, from, mine_from, to, mine_to));
    if (mask == 0) return out;

    const int k = group_size_of(mask, sizes);
    const int axis_count = mesh_.axis_count;
    AllToAllvCounts counts(k);
    std::vector<Box> send_boxes(static_cast<std::size_t>(k));
    std::vector<Box> recv_boxes(static_cast<std::size_t>(k));
    for (int j = 0; j < k; ++j) {
      const auto ju = static_cast<std::size_t>(j);
      const Coords other = member_coords(me, mask, j, sizes, axis_count);
      if (other == me) continue;
      std::int64_t sent = 0;
      std::int64_t received = 0;
      if (serves(from, mask, me, other, axis_count)) {
        send_boxes[ju] = overlap(from, to, to_shape, sizes, me, other);
        sent = send_boxes[ju].volume();
      }
      if (serves(from, mask, other, me, axis_count)) {
        recv_boxes[ju] = overlap(from, to, to_shape, sizes, other, me);
        received = recv_boxes[ju].volume();
      }
      counts.add(j, sent, received, "reshard");
    }
    all_to_all_v_staged<T>(
        counts, group(mask), axes(mask),
        [&](T* send) {
          for (int j = 0; j < k; ++j) {
            const auto ju = static_cast<std::size_t>(j);
            if (counts.send_counts[ju] == 0) continue;
            const Box& box = send_boxes[ju];
            BoxEnds packed{&to, Shape(box.length, box.length + to.rank),
                           Shape(box.start, box.start + to.rank)};
            copy_box(in.data(), send + counts.send_displs[ju],
                     box_copy(box, from, mine_from, to, packed));
          }
        },
        [&](const T* recv) {
          for (int j = 0; j < k; ++j) {
            const auto ju = static_cast<std::size_t>(j);
            if (counts.recv_counts[ju] == 0) continue;
            const Box& box = recv_boxes[ju];
            BoxEnds packed{&to, Shape(box.length, box.length + to.rank),
                           Shape(box.start, box.start + to.rank)};
            copy_box(recv + counts.recv_displs[ju], out.data(),
                     box_copy(box, to, packed, to, mine_to));
          }
        });
    return out;
  }

  const ReshardPlan& plan_;
  const MeshState& mesh_;
  ReduceOp op_;
  mutable Kokkos::View<T*> out_;  // the caller's buffer for the last step, if any
};

/// `t` in layout `need` (the same labels; any order, splits and partial axes), its partial op
/// kept: the one run-time reshard that ops, the einsum engine and the backward pass call (nothing
/// moves when the layouts agree). The result carries no autodiff node.
template <class T>
RuntimeTensor<T> reshard_runtime(const RuntimeTensor<T>& t, const Layout& need,
                                 const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  if (t.layout == need) return t;
  const ReshardPlan plan = plan_reshard(t.layout, need, t.shape, mesh.sizes, mesh.coords,
                                        axis_names, static_cast<std::int64_t>(sizeof(T)));
  RuntimeTensor<T> out(need, shape_in(need, t.layout, t.shape), {}, t.partial_op);
  out.data = ReshardExecutor<T>(plan, mesh, t.partial_op).run(t.data);
  return out;
}

template <class MeshT>
std::vector<std::string> axis_name_list() {
  std::vector<std::string> names;
  for (auto n : MeshT::axis_names) names.emplace_back(n);
  return names;
}

}  // namespace detail

/// The steps that reshard<Target>(t) takes on this rank (collectives, axes, bytes).
template <class Target, class T, class MeshT, fixed_string Spec>
ReshardPlan plan_reshard(const Sharded<T, MeshT, Spec>& source) {
  static_assert(std::is_same_v<typename Target::value_type, T> &&
                    std::is_same_v<typename Target::mesh_type, MeshT>,
                "gshard::reshard: the target must have the same element type and mesh");
  if constexpr (!detail::same_label_set(Sharded<T, MeshT, Spec>::layout, Target::layout)) {
    static_assert(
        sizeof(layout_error::labels_differ_between_layouts<detail::shown<Spec>,
                                                           detail::shown<Target::spec>>) == 0);
  }
  return detail::plan_reshard(Sharded<T, MeshT, Spec>::layout, Target::layout, source.shape(),
                              source.mesh().sizes(), source.mesh().coordinates(),
                              detail::axis_name_list<MeshT>(), std::int64_t{sizeof(T)});
}

/// The value of `source` in Target's layout. Collective over the mesh.
template <class Target, class T, class MeshT, fixed_string Spec>
Target reshard(const Sharded<T, MeshT, Spec>& source, std::source_location where) {
  const detail::UserSite site(where, "reshard");
  const ReshardPlan plan = plan_reshard<Target>(source);
  Shape shape = detail::shape_in(Target::layout, plan.source, source.shape());
  if (plan.steps.empty()) {
    // Same layout: share the shard, like a View copy.
    Target out(source.mesh(), std::move(shape), source.local_view());
    detail::set_partial_op(out, source.partial_op());
    detail::set_grad_node(out, source.grad_node());
    detail::ShardedAccess::share_version(out, detail::ShardedAccess::version(source));
    return out;
  }
  const detail::ReshardExecutor<T> run(plan, detail::mesh_state(source.mesh()),
                                       source.partial_op());
  Target out(source.mesh(), std::move(shape), run.run(source.local_view()));
  detail::set_partial_op(out, source.partial_op());
  // The same global value: it keeps the source's node (the backward driver brings each
  // cotangent to the node's own layout, which is the reverse collective).
  detail::set_grad_node(out, source.grad_node());
  return out;
}

/// Reshards `source` into `target`'s existing storage (its global shape must match), so a loop
/// that reshards every step allocates nothing for the result. An in-place update of `target`:
/// lazy expressions built over it before refuse to run (docs/design.md). Collective over the mesh.
template <class Target, class T, class MeshT, fixed_string Spec>
void reshard_into(const Sharded<T, MeshT, Spec>& source, Target& target,
                  std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "reshard_into");
  const ReshardPlan plan = plan_reshard<Target>(source);
  const Shape shape = detail::shape_in(Target::layout, plan.source, source.shape());
  if (shape != target.shape())
    throw Error("reshard_into",
                "the target " + target.describe() + " does not have the global shape " +
                    detail::shape_string(shape) + " of the source " + source.describe());
  if (plan.steps.empty()) {
    if (target.local_view().data() != source.local_view().data())
      Kokkos::deep_copy(target.local_view(), source.local_view());
  } else {
    const detail::ReshardExecutor<T> run(plan, detail::mesh_state(source.mesh()),
                                         source.partial_op());
    const Kokkos::View<T*> out = run.run(source.local_view(), target.local_view());
    if (out.data() != target.local_view().data()) Kokkos::deep_copy(target.local_view(), out);
  }
  detail::set_partial_op(target, source.partial_op());
  detail::mark_updated(target, "reshard_into");
}

/// One line per step: the collective, its axes, the layouts and the bytes this rank sends.
inline std::string explain(const ReshardPlan& plan) {
  std::ostringstream s;
  auto axes_of = [&](unsigned mask) { return detail::axes_string(mask, plan.axis_names); };
  std::array<std::string_view, max_axes> names{};
  for (std::size_t i = 0; i < plan.axis_names.size(); ++i) names[i] = plan.axis_names[i];
  s << "reshard \"" << detail::layout_string(plan.source, names) << "\" -> \""
    << detail::layout_string(plan.target, names) << "\", global shape "
    << detail::shape_string(plan.shape) << ": " << plan.steps.size() << " step(s), " << plan.bytes()
    << " bytes sent by this rank\n";
  int i = 0;
  for (const ReshardStep& step : plan.steps) {
    s << "  " << ++i << ". " << step_name(step.kind);
    if (step.axes != 0) s << " over " << axes_of(step.axes);
    s << ": \"" << detail::layout_string(step.from, names) << "\" -> \""
      << detail::layout_string(step.to, names) << "\", " << step.bytes << " bytes\n";
  }
  if (plan.steps.empty()) s << "  (no data moves)\n";
  return s.str();
}

}  // namespace gshard
