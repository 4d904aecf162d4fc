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
#include <vector>

#include "../comm/collectives.hpp"
#include "../comm/hierarchical.hpp"
#include "../core/error.hpp"
#include "../kernels/contract.hpp"
#include "../spmd/exchange.hpp"
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
  Kokkos::View<std::int64_t*> pos;            // "G S K": row in the send buffer, or -1
  AllToAllvCounts there{1}, back{1};          // rows x M both ways
  std::int64_t sent = 0, received = 0;        // rows
  std::vector<std::int64_t> expert_rows;      // per local expert: rows received
  std::vector<std::int64_t> expert_first;     // per local expert: its first row, expert-major
  Kokkos::View<std::int64_t*> recv_first;     // per piece (source, expert), source-major: first row
  Kokkos::View<std::int64_t*> grouped_first;  // the same piece's first row, expert-major
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
  std::vector<std::int64_t> recv_first(static_cast<std::size_t>(keys) + 1, 0);
  std::vector<std::int64_t> grouped_first(static_cast<std::size_t>(keys), 0);
  std::vector<std::int64_t> at(rows.expert_first);
  for (std::int64_t key = 0; key < keys; ++key) {
    const auto ku = static_cast<std::size_t>(key);
    recv_first[ku + 1] = recv_first[ku] + recv_keys[ku];
    const auto le = static_cast<std::size_t>(key % p.chunk);
    grouped_first[ku] = at[le];
    at[le] += recv_keys[ku];
  }
  rows.recv_first = on_device(recv_first, "gshard::moe_dropless_recv_first");
  rows.grouped_first = on_device(grouped_first, "gshard::moe_dropless_grouped_first");
  return rows;
}

/// The expert-major row of received row i (source-major): binary search over the pieces.
KOKKOS_INLINE_FUNCTION std::int64_t grouped_row(const Kokkos::View<std::int64_t*>& recv_first,
                                                const Kokkos::View<std::int64_t*>& grouped_first,
                                                std::int64_t keys, std::int64_t i) {
  std::int64_t lo = 0, hi = keys;  // the last piece with recv_first <= i
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    if (recv_first(mid) <= i)
      lo = mid;
    else
      hi = mid;
  }
  return grouped_first(lo) + (i - recv_first(lo));
}

/// Moves rows of width m between the two orders of the received rows: `to_grouped` from the
/// receive order (source-major) into expert-major, else back.
template <class T>
void regroup_rows(const DroplessRows& rows, std::int64_t keys, const T* from, T* to, std::int64_t m,
                  bool to_grouped) {
  const auto rf = rows.recv_first;
  const auto gf = rows.grouped_first;
  Kokkos::parallel_for(
      "gshard::moe_dropless_regroup", Kokkos::RangePolicy<>(0, rows.received * m),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t i = idx / m, c = idx % m;
        const std::int64_t g = grouped_row(rf, gf, keys, i);
        if (to_grouped)
          to[g * m + c] = from[i * m + c];
        else
          to[i * m + c] = from[g * m + c];
      });
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

/// The forward: out "G S M" (local block, zero in padding groups) = sum over each token's
/// assignments held by this group of weight * relu(x wi_e) wo_e.
template <class T>
Kokkos::View<T*> dropless_forward(DroplessSaved<T>& sv, const Kokkos::View<T*>& x) {
  const DroplessPlan& p = sv.plan;
  DroplessRows& rows = sv.rows;
  const std::int64_t m = sv.m, h = sv.h, s = sv.s, k = sv.k;
  const std::int64_t keys = static_cast<std::int64_t>(p.members) * p.chunk;
  const auto R = static_cast<std::size_t>(rows.received);
  sv.xe = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_x"), Kokkos::WithoutInitializing),
      R * static_cast<std::size_t>(m));
  const Kokkos::View<const std::int64_t*> pos = rows.pos;
  const Kokkos::View<const T*> xv = x;
  const std::int64_t n_assign = sv.valid_g * s * k;
  dropless_exchange<T>(
      p, rows.there,
      [&](T* send) {
        Kokkos::parallel_for(
            "gshard::moe_dropless_pack", Kokkos::RangePolicy<>(0, n_assign * m),
            KOKKOS_LAMBDA(std::int64_t idx) {
              const std::int64_t a = idx / m, c = idx % m;
              const std::int64_t r = pos(a);
              if (r >= 0) send[r * m + c] = xv((a / k) * m + c);
            });
      },
      [&](const T* recv) { regroup_rows(rows, keys, recv, sv.xe.data(), m, true); });
  // Grouped GEMM: one per local expert over exactly its rows.
  sv.hidden = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_hidden"), Kokkos::WithoutInitializing),
      R * static_cast<std::size_t>(h));
  Kokkos::View<T*> ye(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_y"), Kokkos::WithoutInitializing),
      R * static_cast<std::size_t>(m));
  for (std::int64_t le = 0; le < p.local; ++le) {
    const std::int64_t r0 = rows.expert_first[static_cast<std::size_t>(le)];
    const std::int64_t nr = rows.expert_rows[static_cast<std::size_t>(le)];
    gemm_rows(sv.xe.data() + r0 * m, false, sv.wi.data() + le * m * h, false,
              sv.hidden.data() + r0 * h, nr, h, m);
  }
  const Kokkos::View<T*> hid = sv.hidden;
  Kokkos::parallel_for(
      "gshard::moe_dropless_relu", Kokkos::RangePolicy<>(0, rows.received * h),
      KOKKOS_LAMBDA(std::int64_t i) { hid(i) = hid(i) > T(0) ? hid(i) : T(0); });
  for (std::int64_t le = 0; le < p.local; ++le) {
    const std::int64_t r0 = rows.expert_first[static_cast<std::size_t>(le)];
    const std::int64_t nr = rows.expert_rows[static_cast<std::size_t>(le)];
    gemm_rows(sv.hidden.data() + r0 * h, false, sv.wo.data() + le * h * m, false,
              ye.data() + r0 * m, nr, m, h);
  }
  sv.back = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_back"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(rows.sent * m));
  dropless_exchange<T>(
      p, rows.back, [&](T* send) { regroup_rows(rows, keys, ye.data(), send, m, false); },
      [&](const T* recv) {
        Kokkos::deep_copy(sv.back, Kokkos::View<const T*>(recv, sv.back.extent(0)));
      });
  // Combine: per token, its assignments' rows weighted by their gates.
  Kokkos::View<T*> out("gshard::moe_dropless_out", static_cast<std::size_t>(sv.g_local * s * m));
  const Kokkos::View<const T*> w = sv.weight;
  const Kokkos::View<const T*> bk = sv.back;
  Kokkos::parallel_for(
      "gshard::moe_dropless_combine", Kokkos::RangePolicy<>(0, sv.valid_g * s * m),
      KOKKOS_LAMBDA(std::int64_t idx) {
        const std::int64_t t = idx / m, c = idx % m;
        T acc = 0;
        for (std::int64_t j = 0; j < k; ++j) {
          const std::int64_t r = pos(t * k + j);
          if (r >= 0) acc += w(t * k + j) * bk(r * m + c);
        }
        out(idx) = acc;
      });
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
  const std::int64_t keys = static_cast<std::int64_t>(p.members) * p.chunk;
  const auto R = static_cast<std::size_t>(rows.received);
  DroplessGrads<T> out;
  out.weight = Kokkos::View<T*>("gshard::moe_dropless_dweight", sv.weight.extent(0));
  out.x = Kokkos::View<T*>("gshard::moe_dropless_dx", static_cast<std::size_t>(sv.g_local * s * m));
  out.wi = Kokkos::View<T*>("gshard::moe_dropless_dwi", sv.wi.extent(0));
  out.wo = Kokkos::View<T*>("gshard::moe_dropless_dwo", sv.wo.extent(0));
  const Kokkos::View<const std::int64_t*> pos = rows.pos;
  const Kokkos::View<const T*> gv = g;
  const Kokkos::View<const T*> w = sv.weight;
  const Kokkos::View<const T*> bk = sv.back;
  const std::int64_t n_assign = sv.valid_g * s * k;
  {
    const Kokkos::View<T*> dw = out.weight;
    Kokkos::parallel_for(
        "gshard::moe_dropless_dweight", Kokkos::RangePolicy<>(0, n_assign),
        KOKKOS_LAMBDA(std::int64_t a) {
          const std::int64_t r = pos(a);
          if (r < 0) return;
          const std::int64_t t = a / k;
          T acc = 0;
          for (std::int64_t c = 0; c < m; ++c) acc += gv(t * m + c) * bk(r * m + c);
          dw(a) = acc;
        });
  }
  // The rows' cotangents to the experts, expert-major.
  Kokkos::View<T*> dye(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_dy"), Kokkos::WithoutInitializing),
      R * static_cast<std::size_t>(m));
  dropless_exchange<T>(
      p, rows.there,
      [&](T* send) {
        Kokkos::parallel_for(
            "gshard::moe_dropless_pack_dy", Kokkos::RangePolicy<>(0, n_assign * m),
            KOKKOS_LAMBDA(std::int64_t idx) {
              const std::int64_t a = idx / m, c = idx % m;
              const std::int64_t r = pos(a);
              if (r >= 0) send[r * m + c] = w(a) * gv((a / k) * m + c);
            });
      },
      [&](const T* recv) { regroup_rows(rows, keys, recv, dye.data(), m, true); });
  Kokkos::View<T*> dh(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_dh"), Kokkos::WithoutInitializing),
      R * static_cast<std::size_t>(h));
  Kokkos::View<T*> dxe(
      Kokkos::view_alloc(std::string("gshard::moe_dropless_dxe"), Kokkos::WithoutInitializing),
      R * static_cast<std::size_t>(m));
  for (std::int64_t le = 0; le < p.local; ++le) {
    const std::int64_t r0 = rows.expert_first[static_cast<std::size_t>(le)];
    const std::int64_t nr = rows.expert_rows[static_cast<std::size_t>(le)];
    if (nr == 0) continue;  // the expert's weight gradients stay zero
    // dh = dy wo_e^T (wo_e stored H x M), dwo_e = hidden^T dy.
    gemm_rows(dye.data() + r0 * m, false, sv.wo.data() + le * h * m, true, dh.data() + r0 * h, nr,
              h, m);
    gemm_rows(sv.hidden.data() + r0 * h, true, dye.data() + r0 * m, false,
              out.wo.data() + le * h * m, h, m, nr);
  }
  {
    const Kokkos::View<const T*> hid = sv.hidden;
    const Kokkos::View<T*> d = dh;
    Kokkos::parallel_for(
        "gshard::moe_dropless_relu_grad", Kokkos::RangePolicy<>(0, rows.received * h),
        KOKKOS_LAMBDA(std::int64_t i) {
          if (!(hid(i) > T(0))) d(i) = T(0);
        });
  }
  for (std::int64_t le = 0; le < p.local; ++le) {
    const std::int64_t r0 = rows.expert_first[static_cast<std::size_t>(le)];
    const std::int64_t nr = rows.expert_rows[static_cast<std::size_t>(le)];
    if (nr == 0) continue;
    // dwi_e = xe^T dh, dxe = dh wi_e^T (wi_e stored M x H).
    gemm_rows(sv.xe.data() + r0 * m, true, dh.data() + r0 * h, false, out.wi.data() + le * m * h, m,
              h, nr);
    gemm_rows(dh.data() + r0 * h, false, sv.wi.data() + le * m * h, true, dxe.data() + r0 * m, nr,
              m, h);
  }
  const Kokkos::View<T*> dx = out.x;
  dropless_exchange<T>(
      p, rows.back, [&](T* send) { regroup_rows(rows, keys, dxe.data(), send, m, false); },
      [&](const T* recv) {
        Kokkos::parallel_for(
            "gshard::moe_dropless_dx", Kokkos::RangePolicy<>(0, sv.valid_g * s * m),
            KOKKOS_LAMBDA(std::int64_t idx) {
              const std::int64_t t = idx / m, c = idx % m;
              T acc = 0;
              for (std::int64_t j = 0; j < k; ++j) {
                const std::int64_t r = pos(t * k + j);
                if (r >= 0) acc += recv[r * m + c];
              }
              dx(idx) = acc;
            });
      });
  return out;
}

}  // namespace gshard::nn::detail
