#pragma once
// The halo exchange of windowed ops (ops/conv.hpp) and its adjoint: the window geometry of one
// sliding dimension, the hops at which blocks need rows other blocks hold, the exchange that
// widens a rank's block to every row its output windows read (send_recv hop by hop, only halo
// bytes move) and the adjoint that returns a cotangent's halo rows to their owners and adds them.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "../comm/collectives.hpp"
#include "../comm/mpi_access.hpp"
#include "../kernels/copy_box.hpp"
#include "../tensor/sharded.hpp"
#include "plan.hpp"

namespace gshard {
namespace detail {

/// One sliding dimension: input size n, window k, stride, dilation, zeros before (pad), output
/// size n_out; `dim` is its position in the input's layout.
struct ConvWindow {
  int dim = 0;
  std::int64_t n = 0, k = 1, stride = 1, dilation = 1, pad = 0, n_out = 0;
};

struct ConvRange {
  std::int64_t lo = 0, hi = 0;
  [[nodiscard]] std::int64_t size() const { return hi > lo ? hi - lo : 0; }
};

inline ConvRange conv_intersect(ConvRange a, ConvRange b) {
  return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)};
}

/// The input rows (clipped to [0, n)) that output block `i` of `shards` needs.
inline ConvRange conv_window_need(const ConvWindow& w, int i, int shards) {
  const std::int64_t co = ceil_div(w.n_out, shards);
  const std::int64_t o0 = co * i;
  const std::int64_t o1 = std::min(w.n_out, o0 + co);
  if (o1 <= o0) return {};
  const ConvRange r{std::max<std::int64_t>(0, o0 * w.stride - w.pad),
                    std::min(w.n, (o1 - 1) * w.stride - w.pad + w.dilation * (w.k - 1) + 1)};
  return r.size() > 0 ? r : ConvRange{};
}

inline ConvRange conv_window_held(const ConvWindow& w, int i, int shards) {
  const std::int64_t c = ceil_div(w.n, shards);
  return {c * i, std::min(w.n, c * (i + 1))};
}

/// The rank in mesh.groups[mask of d's axes] of block `index` of dimension d (the group is
/// row-major over the axes in mesh order; the block index is row-major in d's axis order).
inline int conv_block_group_rank(const DimLayout& d, int index,
                                 const std::array<int, max_axes>& sizes) {
  std::array<int, max_axes> c{};
  for (int i = d.axis_count - 1; i >= 0; --i) {
    const auto a = static_cast<std::size_t>(d.axes[static_cast<std::size_t>(i)]);
    c[a] = index % sizes[a];
    index /= sizes[a];
  }
  int r = 0;
  for (std::size_t a = 0; a < max_axes; ++a)
    if (d.uses(static_cast<int>(a))) r = r * sizes[a] + c[a];
  return r;
}

/// The hops at which some block needs rows another block holds (data flows from block j to
/// block j + hop); the same on every rank, decided from shapes.
inline std::vector<int> conv_hops(const ConvWindow& w, int k) {
  std::vector<int> hops;
  for (int hop = -(k - 1); hop <= k - 1; ++hop) {
    bool any = false;
    for (int i = 0; i < k && !any && hop != 0; ++i)
      if (i - hop >= 0 && i - hop < k)
        any = conv_intersect(conv_window_need(w, i, k), conv_window_held(w, i - hop, k)).size() > 0;
    if (any) hops.push_back(hop);
  }
  return hops;
}

/// This rank's input widened to every row its output windows need: `start` is the global index
/// of local row 0 in each window's dimension; other dimensions are the padded local block.
template <class T>
struct ConvHalo {
  Kokkos::View<T*> data;
  Shape extents;
  std::vector<std::int64_t> start;  // per window
};

/// The halo exchange: per window, in order, hop by hop along the window label's axes, each rank
/// sends every neighbour the rows of its block that the neighbour's windows need (only valid
/// data: padding stays home), so only halo bytes move. Every rank of the mesh makes the same
/// calls (hops are decided from shapes), with MPI_PROC_NULL where nothing goes.
template <class T>
ConvHalo<T> conv_exchange_halo(const Layout& l, const Shape& shape, const Kokkos::View<T*>& local,
                               const std::vector<ConvWindow>& wins, const MeshState& mesh,
                               const std::vector<std::string>& axis_names) {
  ConvHalo<T> h{local, local_extents(l, shape, mesh.sizes), {}};
  Shape valid(static_cast<std::size_t>(l.rank));
  for (int d = 0; d < l.rank; ++d)
    valid[static_cast<std::size_t>(d)] =
        block_of(l.dims[d], shape[static_cast<std::size_t>(d)], mesh.sizes, mesh.coords).valid;
  for (const ConvWindow& w : wins) {
    const auto wd = static_cast<std::size_t>(w.dim);
    const DimLayout& dim = l.dims[w.dim];
    const int k = shard_count(dim, mesh.sizes);
    const int me = shard_index(dim, mesh.sizes, mesh.coords);
    const ConvRange held = conv_window_held(w, me, k);
    const ConvRange need = conv_window_need(w, me, k);
    const std::vector<int> hops = conv_hops(w, k);
    // Nothing to fetch and the block is exactly the rows needed (a whole label, "same"
    // padding): use it in place. Hops are the same on every rank, so no rank waits on us.
    if (hops.empty() && need.lo == held.lo && need.size() == h.extents[wd]) {
      h.start.push_back(need.lo);
      continue;
    }
    Shape ext = h.extents;
    ext[wd] = need.size();
    Kokkos::View<T*> out("gshard::conv halo", static_cast<std::size_t>(product(ext)));
    std::int64_t src_stride[max_dims]{}, dst_stride[max_dims]{};
    row_major_strides(l.rank, h.extents.data(), src_stride);
    row_major_strides(l.rank, ext.data(), dst_stride);
    // A slab: rows [r.lo, r.hi) of dimension wd, the valid part of the others.
    auto slab = [&](ConvRange r) {
      BoxCopy b;
      b.rank = l.rank;
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d)
        b.box[d] = d == wd ? r.size() : valid[d];
      return b;
    };
    auto with_strides = [&](BoxCopy b, const std::int64_t* ss, std::int64_t s0,
                            const std::int64_t* ts, std::int64_t t0) {
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d) {
        b.src_stride[d] = ss[d];
        b.dst_stride[d] = ts[d];
      }
      b.src_start[wd] = s0;
      b.dst_start[wd] = t0;
      return b;
    };
    const ConvRange own = conv_intersect(held, need);
    if (own.size() > 0)
      copy_box(h.data.data(), out.data(),
               with_strides(slab(own), src_stride, own.lo - held.lo, dst_stride, own.lo - need.lo));
    const auto mask = static_cast<std::size_t>(axes_of(dim));
    const std::string axes = axes_string(static_cast<unsigned>(mask), axis_names);
    for (const int hop : hops) {
      const ConvRange send_rows = me + hop >= 0 && me + hop < k
                                      ? conv_intersect(conv_window_need(w, me + hop, k), held)
                                      : ConvRange{};
      const ConvRange recv_rows = me - hop >= 0 && me - hop < k
                                      ? conv_intersect(need, conv_window_held(w, me - hop, k))
                                      : ConvRange{};
      const BoxCopy sb = slab(send_rows);
      const BoxCopy rb = slab(recv_rows);
      Kokkos::View<T*> send("gshard::conv halo send", static_cast<std::size_t>(sb.volume()));
      Kokkos::View<T*> recv("gshard::conv halo recv", static_cast<std::size_t>(rb.volume()));
      std::int64_t packed[max_dims]{};
      row_major_strides(l.rank, sb.box, packed);
      if (sb.volume() > 0)
        copy_box(h.data.data(), send.data(),
                 with_strides(sb, src_stride, send_rows.lo - held.lo, packed, 0));
      {
        MpiAccess<T> s(send, true);
        MpiAccess<T> r(recv, false);
        send_recv(
            s.data(), sb.volume(),
            sb.volume() > 0 ? conv_block_group_rank(dim, me + hop, mesh.sizes) : MPI_PROC_NULL,
            r.data(), rb.volume(),
            rb.volume() > 0 ? conv_block_group_rank(dim, me - hop, mesh.sizes) : MPI_PROC_NULL,
            mesh.groups[mask], axes);
        r.copy_out();
      }
      row_major_strides(l.rank, rb.box, packed);
      if (rb.volume() > 0)
        copy_box(recv.data(), out.data(),
                 with_strides(rb, packed, 0, dst_stride, recv_rows.lo - need.lo));
    }
    h.data = out;
    h.extents = ext;
    valid[wd] = need.size();
    h.start.push_back(need.lo);
  }
  return h;
}

/// dst[box] += src[box], the geometry of copy_box.
template <class T>
void conv_add_box(const T* src, T* dst, const BoxCopy& b) {
  const std::int64_t n = b.volume();
  if (n == 0) return;
  Kokkos::parallel_for(
      "gshard::conv_add_box", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t rest = e, s = 0, t = 0;
        for (int d = b.rank - 1; d >= 0; --d) {
          const std::int64_t i = rest % b.box[d];
          rest /= b.box[d];
          s += (b.src_start[d] + i) * b.src_stride[d];
          t += (b.dst_start[d] + i) * b.dst_stride[d];
        }
        dst[t] += src[s];
      });
}

/// The adjoint of conv_exchange_halo: `halo` holds a cotangent over the widened block that the
/// forward built from layout `l`; every row goes back to the block that holds it and is added
/// there. Windows in reverse order, each hop's send_recv mirrored (rows a rank received at hop h
/// are returned at hop h, to the rank they came from), so exactly the halo bytes move again.
/// Returns the local block, padding zero.
template <class T>
Kokkos::View<T*> conv_return_halo(const Layout& l, const Shape& shape, Kokkos::View<T*> halo,
                                  const std::vector<ConvWindow>& wins, const MeshState& mesh,
                                  const std::vector<std::string>& axis_names) {
  struct Stage {
    std::size_t wd = 0;
    Shape ext, valid;  // the widened block's geometry before this window's exchange
    ConvRange held, need;
    std::vector<int> hops;
    int k = 1, me = 0;
    bool in_place = false;
  };
  std::vector<Stage> stages;
  Shape ext = local_extents(l, shape, mesh.sizes);
  Shape valid(static_cast<std::size_t>(l.rank));
  for (int d = 0; d < l.rank; ++d)
    valid[static_cast<std::size_t>(d)] =
        block_of(l.dims[d], shape[static_cast<std::size_t>(d)], mesh.sizes, mesh.coords).valid;
  for (const ConvWindow& w : wins) {  // replays the forward's decisions
    Stage st;
    st.wd = static_cast<std::size_t>(w.dim);
    st.k = shard_count(l.dims[w.dim], mesh.sizes);
    st.me = shard_index(l.dims[w.dim], mesh.sizes, mesh.coords);
    st.held = conv_window_held(w, st.me, st.k);
    st.need = conv_window_need(w, st.me, st.k);
    st.hops = conv_hops(w, st.k);
    st.in_place = st.hops.empty() && st.need.lo == st.held.lo && st.need.size() == ext[st.wd];
    st.ext = ext;
    st.valid = valid;
    if (!st.in_place) {
      ext[st.wd] = st.need.size();
      valid[st.wd] = st.need.size();
    }
    stages.push_back(std::move(st));
  }
  Kokkos::View<T*> cur = halo;
  Shape cur_ext = ext;
  for (std::size_t si = stages.size(); si-- > 0;) {
    const Stage& st = stages[si];
    const ConvWindow& w = wins[si];
    if (st.in_place) continue;
    const std::size_t wd = st.wd;
    Kokkos::View<T*> out("gshard::conv halo return", static_cast<std::size_t>(product(st.ext)));
    std::int64_t cur_stride[max_dims]{}, out_stride[max_dims]{};
    row_major_strides(l.rank, cur_ext.data(), cur_stride);
    row_major_strides(l.rank, st.ext.data(), out_stride);
    auto slab = [&](ConvRange r) {
      BoxCopy b;
      b.rank = l.rank;
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d)
        b.box[d] = d == wd ? r.size() : st.valid[d];
      return b;
    };
    auto with_strides = [&](BoxCopy b, const std::int64_t* ss, std::int64_t s0,
                            const std::int64_t* ts, std::int64_t t0) {
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d) {
        b.src_stride[d] = ss[d];
        b.dst_stride[d] = ts[d];
      }
      b.src_start[wd] = s0;
      b.dst_start[wd] = t0;
      return b;
    };
    const ConvRange own = conv_intersect(st.held, st.need);
    if (own.size() > 0)
      copy_box(cur.data(), out.data(),
               with_strides(slab(own), cur_stride, own.lo - st.need.lo, out_stride,
                            own.lo - st.held.lo));
    const DimLayout& dim = l.dims[w.dim];
    const auto mask = static_cast<std::size_t>(axes_of(dim));
    const std::string axes = axes_string(static_cast<unsigned>(mask), axis_names);
    const int k = st.k, me = st.me;
    for (const int hop : st.hops) {
      // Forward: rows `back` came from block me - hop; rows `mine` went to block me + hop.
      const ConvRange back = me - hop >= 0 && me - hop < k
                                 ? conv_intersect(st.need, conv_window_held(w, me - hop, k))
                                 : ConvRange{};
      const ConvRange mine = me + hop >= 0 && me + hop < k
                                 ? conv_intersect(conv_window_need(w, me + hop, k), st.held)
                                 : ConvRange{};
      const BoxCopy sb = slab(back);
      const BoxCopy rb = slab(mine);
      Kokkos::View<T*> send("gshard::conv halo send", static_cast<std::size_t>(sb.volume()));
      Kokkos::View<T*> recv("gshard::conv halo recv", static_cast<std::size_t>(rb.volume()));
      std::int64_t packed[max_dims]{};
      row_major_strides(l.rank, sb.box, packed);
      if (sb.volume() > 0)
        copy_box(cur.data(), send.data(),
                 with_strides(sb, cur_stride, back.lo - st.need.lo, packed, 0));
      {
        MpiAccess<T> s(send, true);
        MpiAccess<T> r(recv, false);
        send_recv(
            s.data(), sb.volume(),
            sb.volume() > 0 ? conv_block_group_rank(dim, me - hop, mesh.sizes) : MPI_PROC_NULL,
            r.data(), rb.volume(),
            rb.volume() > 0 ? conv_block_group_rank(dim, me + hop, mesh.sizes) : MPI_PROC_NULL,
            mesh.groups[mask], axes);
        r.copy_out();
      }
      row_major_strides(l.rank, rb.box, packed);
      if (rb.volume() > 0)
        conv_add_box(recv.data(), out.data(),
                     with_strides(rb, packed, 0, out_stride, mine.lo - st.held.lo));
    }
    cur = out;
    cur_ext = st.ext;
  }
  return cur;
}

}  // namespace detail
}  // namespace gshard
