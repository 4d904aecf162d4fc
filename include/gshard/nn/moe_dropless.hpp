#pragma once
// Dropless expert computation (MegaBlocks-style) for nn::moe with MoeOptions::dropless: every
// routed (token, choice) assignment is computed, none padded.
//
//   count  each rank counts its assignments per destination expert (one thread per group)
//   AllToAll of the counts (members x local experts), then one AllToAllv of exactly those rows
//   grouped GEMM: relu(x_e wi_e) wo_e, one GEMM per local expert over exactly its rows
//   the reverse AllToAllv, then the weighted combine per token
//
// The exchange runs over the mesh axes that split both the experts (E of wi) and the tokens (G of
// x). Along E's other axes the tokens are replicated: each copy computes the assignments to the
// experts it holds and the outputs are partial sums over those axes (finished by the caller's
// reshard). Plain Kokkos views and host vectors: nothing here names a Sharded type, so the
// kernels compile for every backend.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../comm/collectives.hpp"
#include "../comm/hierarchical.hpp"
#include "../core/error.hpp"
#include "../kernels/contract.hpp"
#include "../kernels/rows.hpp"
#include "../spmd/exchange.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/geometry.hpp"

namespace gshard::nn::detail {

using gshard::detail::AllToAllvCounts;
using gshard::detail::MeshState;

/// Who computes which assignment: the exchange group (ranks differing only on the axes that
/// split both E and G, ordered row-major over them) and the member holding each expert.
struct DroplessPlan {
  unsigned mask = 0;
  MPI_Comm group = MPI_COMM_SELF;
  std::string axes;  // the group's axes, for counters and traces
  // Tutel's 2DH exchange when asked for and the group spans two or more axes: the first axis
  // (the nodes) is `outer`, the others `inner` (comm/hierarchical.hpp).
  bool hierarchical = false;
  MPI_Comm outer = MPI_COMM_SELF, inner = MPI_COMM_SELF;
  std::string outer_axes, inner_axes;
  int members = 1;                  // size of the group
  std::int64_t chunk = 0;           // experts per block (local E extent, padded)
  std::int64_t experts = 0;         // E
  std::int64_t local = 0;           // valid experts here
  std::vector<int> owner;           // per expert: its member, or -1 (held by a copy off the group)
  std::vector<std::int64_t> first;  // per member: its first expert
};

/// The plan for experts split by `e_dim` and tokens whose G is split by `g_dim`.
inline DroplessPlan dropless_plan(const MeshState& ms, const DimLayout& e_dim,
                                  const DimLayout& g_dim, std::int64_t experts,
                                  const std::vector<std::string>& axis_names,
                                  bool hierarchical = false) {
  DroplessPlan p;
  p.experts = experts;
  for (int i = 0; i < e_dim.axis_count; ++i)
    if (g_dim.uses(e_dim.axes[i])) p.mask |= 1u << static_cast<unsigned>(e_dim.axes[i]);
  p.group = p.mask == 0 ? MPI_COMM_SELF : ms.groups[p.mask];
  p.axes = gshard::detail::axes_string(p.mask, axis_names);
  for (int a = 0; a < ms.axis_count; ++a)
    if (p.mask & (1u << static_cast<unsigned>(a))) p.members *= ms.sizes[a];
  p.owner.assign(static_cast<std::size_t>(experts), -1);
  p.first.assign(static_cast<std::size_t>(p.members), 0);
  for (int j = 0; j < p.members; ++j) {
    gshard::Coords c = ms.coords;  // member j: row-major over the mask's axes, last fastest
    for (int a = ms.axis_count - 1, r = j; a >= 0; --a) {
      if (!(p.mask & (1u << static_cast<unsigned>(a)))) continue;
      c[static_cast<std::size_t>(a)] = r % ms.sizes[a];
      r /= ms.sizes[a];
    }
    const gshard::detail::Block b = gshard::detail::block_of(e_dim, experts, ms.sizes, c);
    p.chunk = b.chunk;
    p.first[static_cast<std::size_t>(j)] = b.offset;
    for (std::int64_t e = b.offset; e < b.offset + b.valid; ++e)
      p.owner[static_cast<std::size_t>(e)] = j;
  }
  p.local = gshard::detail::block_of(e_dim, experts, ms.sizes, ms.coords).valid;
  const unsigned outer = p.mask & (~p.mask + 1u);  // the lowest bit: the first axis
  if (hierarchical && p.mask != outer) {
    p.hierarchical = true;
    p.outer = ms.groups[outer];
    p.inner = ms.groups[p.mask & ~outer];
    p.outer_axes = gshard::detail::axes_string(outer, axis_names);
    p.inner_axes = gshard::detail::axes_string(p.mask & ~outer, axis_names);
  }
  return p;
}

/// A host vector on the device.
template <class T>
Kokkos::View<T*> on_device(const std::vector<T>& v, const char* label) {
  Kokkos::View<T*> d(Kokkos::view_alloc(std::string(label), Kokkos::WithoutInitializing), v.size());
  const auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = v[i];
  Kokkos::deep_copy(d, h);
  return d;
}

/// One step's routing as rows: where each assignment's row sits in the send buffer, how many rows
/// go to and come from each (member, local expert), and where the received rows sit grouped by
/// expert. Shared by the forward and the backward (the same exchange both ways).
struct DroplessRows {
  Kokkos::View<std::int64_t*> pos;         // "G S K": row in the send buffer, or -1
  AllToAllvCounts there{1}, back{1};       // rows x M both ways
  std::int64_t sent = 0, received = 0;     // rows
  std::vector<std::int64_t> expert_rows;   // per local expert: rows received
  std::vector<std::int64_t> expert_first;  // per local expert: its first row, expert-major
  // Per piece (source member j, local expert le), key j * chunk + le: its rows, its first row in
  // the receive order (source-major, as the reverse exchange sends it back) and expert-major.
  std::vector<std::int64_t> piece_rows, recv_first, grouped_first;
};
/// Counts, positions and the counts' exchange for the assignments `slot` ("G S K", e * S + pos,
/// -1 for skipped) of valid_g groups of S tokens. `max_rows` > 0: the most rows a rank may
/// receive (every rank throws alike when one would exceed it).
inline DroplessRows dropless_rows(const DroplessPlan& p, const MeshState& ms,
                                  const Kokkos::View<std::int64_t*>& slot, std::int64_t g_local,
                                  std::int64_t valid_g, std::int64_t s, std::int64_t k,
                                  std::int64_t m, std::int64_t max_rows) {
  DroplessRows rows;
  const std::int64_t keys = static_cast<std::int64_t>(p.members) * p.chunk;
  const std::int64_t n = g_local * s * k;
  rows.pos = Kokkos::View<std::int64_t*>(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_pos"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(n));
  // Per (key, group) counts, key-major, then their exclusive scan: the rows of one key are in
  // group order, and within a group in assignment order (deterministic on every backend).
  Kokkos::View<std::int64_t*> count("gshard::moe_dropless_count",
                                    static_cast<std::size_t>(keys * valid_g + 1));
  const auto owner = on_device(p.owner, "gshard::moe_dropless_owner");
  const auto first = on_device(p.first, "gshard::moe_dropless_first");
  const std::int64_t chunk = p.chunk;
  const Kokkos::View<std::int64_t*> pos = rows.pos;
  const Kokkos::View<const std::int64_t*> sl = slot;
  Kokkos::parallel_for(
      "gshard::moe_dropless_count", Kokkos::RangePolicy<>(0, valid_g),
      KOKKOS_LAMBDA(std::int64_t grp) {
        for (std::int64_t a = grp * s * k; a < (grp + 1) * s * k; ++a) {
          const std::int64_t v = sl(a);
          const int o = v < 0 ? -1 : owner(v / s);
          if (o < 0) continue;
          const std::int64_t key = o * chunk + (v / s - first(o));
          count(key * valid_g + grp) += 1;
        }
      });
  Kokkos::parallel_scan(
      "gshard::moe_dropless_scan", Kokkos::RangePolicy<>(0, keys * valid_g + 1),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t & acc, bool final) {
        const std::int64_t c = count(i);
        if (final) count(i) = acc;
        acc += c;
      });
  Kokkos::parallel_for(
      "gshard::moe_dropless_positions", Kokkos::RangePolicy<>(0, g_local),
      KOKKOS_LAMBDA(std::int64_t grp) {
        for (std::int64_t a = grp * s * k; a < (grp + 1) * s * k; ++a) {
          const std::int64_t v = grp < valid_g ? sl(a) : -1;
          const int o = v < 0 ? -1 : owner(v / s);
          if (o < 0) {
            pos(a) = -1;
            continue;
          }
          const std::int64_t key = o * chunk + (v / s - first(o));
          pos(a) = count(key * valid_g + grp)++;
        }
      });
  // The send counts per key: the scan's values at key boundaries (after the positions kernel
  // each (key, group) entry has advanced to the next one's start).
  std::vector<std::int64_t> send_keys(static_cast<std::size_t>(keys), 0);
  {
    const auto h = Kokkos::create_mirror_view(count);
    Kokkos::deep_copy(h, count);
    std::int64_t prev = 0;
    for (std::int64_t key = 0; key < keys; ++key) {
      const std::int64_t end =
          valid_g > 0 ? h(static_cast<std::size_t>((key + 1) * valid_g - 1)) : std::int64_t{0};
      send_keys[static_cast<std::size_t>(key)] = end - prev;
      prev = end;
    }
    rows.sent = prev;
  }
  std::vector<std::int64_t> recv_keys(send_keys);
  if (p.members > 1)
    gshard::detail::all_to_all(send_keys.data(), recv_keys.data(), p.chunk, p.group, p.axes);
  rows.received = 0;
  for (std::int64_t v : recv_keys) rows.received += v;
  if (max_rows > 0) {
    std::int64_t worst = rows.received;
    const gshard::detail::CollectiveWatch watch("AllReduce (row limit)", "all", ms.comm);
    MPI_Allreduce(MPI_IN_PLACE, &worst, 1, MPI_INT64_T, MPI_MAX, ms.comm);
    if (worst > max_rows)
      throw Error("moe", "dropless routing sends " + std::to_string(worst) +
                             " rows to one rank's experts, over the limit of " +
                             std::to_string(max_rows) +
                             " (MoeOptions::dropless_max_rows); the worst case is every "
                             "assignment of the exchange group to one expert. Raise the limit, "
                             "balance the router, or use a capacity factor");
  }
  rows.there = AllToAllvCounts(p.members);
  rows.back = AllToAllvCounts(p.members);
  for (int j = 0; j < p.members; ++j) {
    std::int64_t out = 0, in = 0;
    for (std::int64_t le = 0; le < p.chunk; ++le) {
      out += send_keys[static_cast<std::size_t>(j * p.chunk + le)];
      in += recv_keys[static_cast<std::size_t>(j * p.chunk + le)];
    }
    rows.there.add(j, out * m, in * m, "moe dropless dispatch");
    rows.back.add(j, in * m, out * m, "moe dropless combine");
  }
  // Received pieces (source j, expert le) arrive source-major; the GEMMs want them expert-major.
  rows.expert_rows.assign(static_cast<std::size_t>(p.chunk), 0);
  rows.expert_first.assign(static_cast<std::size_t>(p.chunk), 0);
  for (int j = 0; j < p.members; ++j)
    for (std::int64_t le = 0; le < p.chunk; ++le)
      rows.expert_rows[static_cast<std::size_t>(le)] +=
          recv_keys[static_cast<std::size_t>(j * p.chunk + le)];
  for (std::int64_t le = 1; le < p.chunk; ++le)
    rows.expert_first[static_cast<std::size_t>(le)] =
        rows.expert_first[static_cast<std::size_t>(le - 1)] +
        rows.expert_rows[static_cast<std::size_t>(le - 1)];
  rows.piece_rows = recv_keys;
  rows.recv_first.assign(static_cast<std::size_t>(keys), 0);
  rows.grouped_first.assign(static_cast<std::size_t>(keys), 0);
  std::vector<std::int64_t> at(rows.expert_first);
  for (std::int64_t key = 0, next = 0; key < keys; ++key) {
    const auto ku = static_cast<std::size_t>(key);
    rows.recv_first[ku] = next;
    next += recv_keys[ku];
    const auto le = static_cast<std::size_t>(key % p.chunk);
    rows.grouped_first[ku] = at[le];
    at[le] += recv_keys[ku];
  }
  return rows;
}

/// f(le, first row, rows) for each local expert with rows: its rows are contiguous expert-major.
template <class F>
void for_each_expert(const DroplessPlan& p, const DroplessRows& rows, F&& f) {
  for (std::int64_t le = 0; le < p.local; ++le) {
    const std::int64_t nr = rows.expert_rows[static_cast<std::size_t>(le)];
    if (nr > 0) f(le, rows.expert_first[static_cast<std::size_t>(le)], nr);
  }
}

/// f(le, expert-major first row, receive-order first row, rows) for each piece with rows.
template <class F>
void for_each_piece(const DroplessPlan& p, const DroplessRows& rows, F&& f) {
  for (std::size_t key = 0; key < rows.piece_rows.size(); ++key)
    if (rows.piece_rows[key] > 0)
      f(static_cast<std::int64_t>(key) % p.chunk, rows.grouped_first[key], rows.recv_first[key],
        rows.piece_rows[key]);
}

/// Received rows of width m (source-major) into expert-major order: one contiguous copy per
/// piece (a memcpy on the host, a device copy on GPUs).
template <class T>
void regroup_rows(const DroplessPlan& p, const DroplessRows& rows, const T* from, T* to,
                  std::int64_t m) {
  using Unmanaged = Kokkos::View<T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using ConstUnmanaged = Kokkos::View<const T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  const Kokkos::DefaultExecutionSpace exec;
  for_each_piece(
      p, rows, [&](std::int64_t, std::int64_t grouped, std::int64_t recv, std::int64_t nr) {
        Kokkos::deep_copy(exec, Unmanaged(to + grouped * m, static_cast<std::size_t>(nr * m)),
                          ConstUnmanaged(from + recv * m, static_cast<std::size_t>(nr * m)));
      });
}

/// A per-step buffer of n elements from the recycled results (spmd/reshard.hpp), its capacity
/// rounded up to a multiple of a power of two between n/32 and n/16, so that steps whose counts
/// differ a little reuse one allocation (and skip its first touch). Not initialised.
template <class T>
Kokkos::View<T*> step_buffer(std::int64_t n, const char* label) {
  std::int64_t grain = 1;
  while (grain * 16 <= n) grain *= 2;
  const std::int64_t capacity = (n + grain - 1) / grain * grain;
  return Kokkos::subview(gshard::detail::recycled_result<T>(capacity, label),
                         std::make_pair(std::int64_t{0}, n));
}

/// One exchange of rows of width m (`rows.there` or `rows.back`); none in a group of one.
template <class T, class Pack, class Unpack>
void dropless_exchange(const DroplessPlan& p, const AllToAllvCounts& c, Pack&& pack,
                       Unpack&& unpack) {
  if (p.members == 1) {
    const Kokkos::View<T*> buffer = gshard::detail::workspace<T>(0, c.send_total);
    pack(buffer.data());
    unpack(static_cast<const T*>(buffer.data()));
    return;
  }
  if (p.hierarchical) {
    // The 2DH exchange packs and regroups on the host (comm/hierarchical.hpp), so it gets host
    // copies even where MPI takes device pointers.
    const Kokkos::View<T*> send = gshard::detail::workspace<T>(0, c.send_total);
    const Kokkos::View<T*> recv = gshard::detail::workspace<T>(1, c.recv_total);
    pack(send.data());
    Kokkos::DefaultExecutionSpace().fence();
    const auto host_send = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), send);
    const auto host_recv = Kokkos::create_mirror_view(Kokkos::HostSpace(), recv);
    gshard::detail::all_to_all_v_hierarchical(
        static_cast<const T*>(host_send.data()), c.send_counts, c.send_displs, host_recv.data(),
        c.recv_counts, c.recv_displs, p.inner, p.outer, p.inner_axes, p.outer_axes);
    Kokkos::deep_copy(recv, host_recv);
    unpack(static_cast<const T*>(recv.data()));
    return;
  }
  gshard::detail::all_to_all_v_staged<T>(c, p.group, p.axes, std::forward<Pack>(pack),
                                         std::forward<Unpack>(unpack));
}

/// What the backward needs of a forward.
template <class T>
struct DroplessSaved {
  DroplessPlan plan;
  DroplessRows rows;
  std::int64_t g_local = 0, valid_g = 0, s = 0, k = 0, m = 0, h = 0;
  Kokkos::View<T*> xe;      // received rows, expert-major (R x M)
  Kokkos::View<T*> hidden;  // relu(xe wi) (R x H)
  Kokkos::View<T*> back;    // each assignment's expert output, send order (rows x M)
  Kokkos::View<T*> weight;  // "G S K"
  Kokkos::View<T*> wi, wo;  // local blocks "E M H", "E H M"
};

template <class T>
void gemm_rows(const T* a, bool ta, const T* b, bool tb, T* c, std::int64_t m, std::int64_t n,
               std::int64_t k) {
  gshard::detail::GemmShape s;
  s.batch = 1, s.m = m, s.n = n, s.k = k;
  gshard::detail::gemm_batched(a, ta, b, tb, c, s);
}

/// send (source-major rows of width m) = a (expert-major rows of width h) times each piece's
/// expert matrix: w_e (H x M) or, transposed, w_e stored M x H. The last GEMM of the forward and
/// of the backward, writing the reverse exchange's send buffer directly.
template <class T>
void gemm_pieces(const DroplessPlan& p, const DroplessRows& rows, const T* a, const T* w,
                 bool transposed, T* send, std::int64_t m, std::int64_t h) {
  for_each_piece(
      p, rows, [&](std::int64_t le, std::int64_t grouped, std::int64_t recv, std::int64_t nr) {
        gemm_rows(a + grouped * h, false, w + le * h * m, transposed, send + recv * m, nr, m, h);
      });
}

/// Row kernels (kernels/rows.hpp) of the dropless passes: a row per assignment or per token.
/// Send row pos(a) = assignment a's token row of x.
template <class T>
struct PackRows {
  Kokkos::View<const std::int64_t*> pos;
  Kokkos::View<const T*> x;
  T* send;
  std::int64_t k, m;
  struct State {
    std::int64_t r, t;
  };
  KOKKOS_INLINE_FUNCTION State begin(std::int64_t a) const { return {pos(a), a / k}; }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State& s) const { return s.r < 0 ? 0 : m; }
  KOKKOS_INLINE_FUNCTION void element(const State& s, std::int64_t c) const {
    send[s.r * m + c] = x(s.t * m + c);
  }
};

/// The backward's pass per assignment: send row pos(a) = gate(a) * g's token row, and the gate's
/// cotangent dw(a) = g's token row . the assignment's expert output.
template <class T>
struct PackCotangentRows {
  Kokkos::View<const std::int64_t*> pos;
  Kokkos::View<const T*> g, w, back;
  T* send;
  Kokkos::View<T*> dw;
  std::int64_t k, m;
  struct Reduce {
    using Acc = T;
    KOKKOS_INLINE_FUNCTION static Acc identity() { return T(0); }
    KOKKOS_INLINE_FUNCTION static void combine(Acc& d, const Acc& s) { d += s; }
  };
  struct State {
    std::int64_t r, t;
    T wa;
  };
  KOKKOS_INLINE_FUNCTION State begin(std::int64_t a) const {
    const std::int64_t r = pos(a);
    return {r, a / k, r < 0 ? T(0) : w(a)};
  }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State& s) const { return s.r < 0 ? 0 : m; }
  KOKKOS_INLINE_FUNCTION T term(const State& s, std::int64_t c) const {
    const T gc = g(s.t * m + c);
    send[s.r * m + c] = s.wa * gc;
    return gc * back(s.r * m + c);
  }
  KOKKOS_INLINE_FUNCTION void finish(std::int64_t a, const State& s, const T& acc) const {
    if (s.r >= 0) dw(a) = acc;
  }
};

/// Out row t = the sum over token t's assignments of (their gate, or 1) * their row of `rows`.
template <class T>
struct CombineRows {
  Kokkos::View<const std::int64_t*> pos;
  Kokkos::View<const T*> w;  // empty: unweighted
  const T* rows;
  Kokkos::View<T*> out;
  std::int64_t k, m;
  struct State {
    std::int64_t t;
  };
  KOKKOS_INLINE_FUNCTION State begin(std::int64_t t) const { return {t}; }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State&) const { return m; }
  KOKKOS_INLINE_FUNCTION void element(const State& s, std::int64_t c) const {
    T acc = 0;
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t a = s.t * k + j;
      const std::int64_t r = pos(a);
      if (r >= 0) acc += (w.extent(0) > 0 ? w(a) : T(1)) * rows[r * m + c];
    }
    out(s.t * m + c) = acc;
  }
};

/// The forward: out "G S M" (local block, zero in padding groups) = sum over each token's
/// assignments held by this group of weight * relu(x wi_e) wo_e.
template <class T>
Kokkos::View<T*> dropless_forward(DroplessSaved<T>& sv, const Kokkos::View<T*>& x) {
  const DroplessPlan& p = sv.plan;
  DroplessRows& rows = sv.rows;
  const std::int64_t m = sv.m, h = sv.h, s = sv.s, k = sv.k;
  sv.xe = step_buffer<T>(rows.received * m, "gshard::moe_dropless_x");
  const Kokkos::View<const std::int64_t*> pos = rows.pos;
  const Kokkos::View<const T*> xv = x;
  const std::int64_t n_assign = sv.valid_g * s * k;
  dropless_exchange<T>(
      p, rows.there,
      [&](T* send) {
        gshard::detail::for_each_row("gshard::moe_dropless_pack", n_assign,
                                     PackRows<T>{pos, xv, send, k, m});
      },
      [&](const T* recv) { regroup_rows(p, rows, recv, sv.xe.data(), m); });
  // Grouped GEMM: one per local expert over exactly its rows, expert-major.
  sv.hidden = step_buffer<T>(rows.received * h, "gshard::moe_dropless_hidden");
  for_each_expert(p, rows, [&](std::int64_t le, std::int64_t r0, std::int64_t nr) {
    gemm_rows(sv.xe.data() + r0 * m, false, sv.wi.data() + le * m * h, false,
              sv.hidden.data() + r0 * h, nr, h, m);
  });
  const Kokkos::View<T*> hid = sv.hidden;
  Kokkos::parallel_for(
      "gshard::moe_dropless_relu", Kokkos::RangePolicy<>(0, rows.received * h),
      KOKKOS_LAMBDA(std::int64_t i) { hid(i) = hid(i) > T(0) ? hid(i) : T(0); });
  // The second GEMM per piece, straight into the reverse exchange's send buffer (source-major).
  sv.back = step_buffer<T>(rows.sent * m, "gshard::moe_dropless_back");
  dropless_exchange<T>(
      p, rows.back,
      [&](T* send) { gemm_pieces(p, rows, sv.hidden.data(), sv.wo.data(), false, send, m, h); },
      [&](const T* recv) {
        Kokkos::deep_copy(sv.back, Kokkos::View<const T*, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                                       recv, sv.back.extent(0)));
      });
  // Combine: per token, its assignments' rows weighted by their gates.
  Kokkos::View<T*> out("gshard::moe_dropless_out", static_cast<std::size_t>(sv.g_local * s * m));
  gshard::detail::for_each_row(
      "gshard::moe_dropless_combine", sv.valid_g * s,
      CombineRows<T>{pos, sv.weight, static_cast<const T*>(sv.back.data()), out, k, m});
  return out;
}

/// The cotangents of x "G S M", the weights "G S K", wi and wo (local blocks) from the output's
/// cotangent g "G S M" (local block).
template <class T>
struct DroplessGrads {
  Kokkos::View<T*> x, weight, wi, wo;
};

template <class T>
DroplessGrads<T> dropless_backward(const DroplessSaved<T>& sv, const Kokkos::View<T*>& g) {
  const DroplessPlan& p = sv.plan;
  const DroplessRows& rows = sv.rows;
  const std::int64_t m = sv.m, h = sv.h, s = sv.s, k = sv.k;
  DroplessGrads<T> out;
  out.weight = Kokkos::View<T*>("gshard::moe_dropless_dweight", sv.weight.extent(0));
  out.x = Kokkos::View<T*>("gshard::moe_dropless_dx", static_cast<std::size_t>(sv.g_local * s * m));
  out.wi = Kokkos::View<T*>("gshard::moe_dropless_dwi", sv.wi.extent(0));
  out.wo = Kokkos::View<T*>("gshard::moe_dropless_dwo", sv.wo.extent(0));
  const Kokkos::View<const std::int64_t*> pos = rows.pos;
  const Kokkos::View<const T*> gv = g;
  const Kokkos::View<const T*> w = sv.weight;
  const Kokkos::View<const T*> bk = sv.back;
  const Kokkos::View<T*> dw = out.weight;
  const std::int64_t n_assign = sv.valid_g * s * k;
  // One pass per assignment: the gate's cotangent (its row's output . g) and the row's cotangent
  // (gate * g) to its expert, then expert-major.
  const Kokkos::View<T*> dye = step_buffer<T>(rows.received * m, "gshard::moe_dropless_dy");
  dropless_exchange<T>(
      p, rows.there,
      [&](T* send) {
        gshard::detail::reduce_rows("gshard::moe_dropless_pack_dy", n_assign,
                                    PackCotangentRows<T>{pos, gv, w, bk, send, dw, k, m});
      },
      [&](const T* recv) { regroup_rows(p, rows, recv, dye.data(), m); });
  const Kokkos::View<T*> dh = step_buffer<T>(rows.received * h, "gshard::moe_dropless_dh");
  // dh = dy wo_e^T (wo_e stored H x M), dwo_e = hidden^T dy; experts without rows keep zero.
  for_each_expert(p, rows, [&](std::int64_t le, std::int64_t r0, std::int64_t nr) {
    gemm_rows(dye.data() + r0 * m, false, sv.wo.data() + le * h * m, true, dh.data() + r0 * h, nr,
              h, m);
    gemm_rows(sv.hidden.data() + r0 * h, true, dye.data() + r0 * m, false,
              out.wo.data() + le * h * m, h, m, nr);
  });
  {
    const Kokkos::View<const T*> hid = sv.hidden;
    const Kokkos::View<T*> d = dh;
    Kokkos::parallel_for(
        "gshard::moe_dropless_relu_grad", Kokkos::RangePolicy<>(0, rows.received * h),
        KOKKOS_LAMBDA(std::int64_t i) {
          if (!(hid(i) > T(0))) d(i) = T(0);
        });
  }
  // dwi_e = xe^T dh (wi_e stored M x H).
  for_each_expert(p, rows, [&](std::int64_t le, std::int64_t r0, std::int64_t nr) {
    gemm_rows(sv.xe.data() + r0 * m, true, dh.data() + r0 * h, false, out.wi.data() + le * m * h, m,
              h, nr);
  });
  const Kokkos::View<T*> dx = out.x;
  dropless_exchange<T>(
      p, rows.back,
      // dxe = dh wi_e^T per piece.
      [&](T* send) { gemm_pieces(p, rows, dh.data(), sv.wi.data(), true, send, m, h); },
      [&](const T* recv) {
        gshard::detail::for_each_row("gshard::moe_dropless_dx", sv.valid_g * s,
                                     CombineRows<T>{pos, {}, recv, dx, k, m});
      });
  return out;
}

}  // namespace gshard::nn::detail
