#pragma once
// Tutel's hierarchical ("2DH") AllToAllv: the exchange of one AllToAllv over a two-level group
// (nodes x ranks per node) done as an intra-node step and an inter-node step, so that each rank
// sends N-1 large inter-node messages instead of N*L-L small ones (docs/design.md, "Hierarchical
// AllToAll (Tutel 2DH)").
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives.hpp"

namespace gshard::detail {

/// Host staging of the hierarchical exchange, one set per element type, kept across calls so a
/// repeated exchange allocates nothing once the buffers are large enough (MPI is funneled through
/// one thread, as for spmd/exchange.hpp's workspace).
template <class T>
struct HierarchicalStaging {
  std::vector<T> packed;     // step 1's send: pieces grouped by inner peer, then by node
  std::vector<T> gathered;   // step 1's receive: by inner source, then by destination node
  std::vector<T> regrouped;  // step 2's send: by destination node, then by inner source
  std::vector<T> received;   // step 2's receive when recv_displs are not contiguous per node

  static T* sized(std::vector<T>& v, std::int64_t n) {
    if (static_cast<std::int64_t>(v.size()) < n) {
      v.clear();  // grows without copying the old contents
      v.resize(static_cast<std::size_t>(n));
    }
    return v.data();
  }
  static HierarchicalStaging& instance() {
    static HierarchicalStaging staging;
    return staging;
  }
};

/// Exclusive prefix sums of counts as MPI displacements; returns the total (checked to fit).
inline std::int64_t displacements_of(const std::vector<std::int64_t>& counts,
                                     std::vector<int>& counts_out, std::vector<int>& displs_out,
                                     const char* what) {
  counts_out.resize(counts.size());
  displs_out.resize(counts.size());
  std::int64_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    counts_out[i] = mpi_count(counts[i], what);
    displs_out[i] = mpi_count(total, what);
    total += counts[i];
  }
  mpi_count(total, what);
  return total;
}

/// One step of the hierarchical exchange: MPI_Alltoallv over `group`, traced with `detail` and
/// counted under `axes` with the bytes sent to other members.
template <class T>
void hierarchical_step(const T* send, const std::vector<int>& send_counts,
                       const std::vector<int>& send_displs, T* recv,
                       const std::vector<int>& recv_counts, const std::vector<int>& recv_displs,
                       MPI_Comm group, int me, const std::string& axes, const char* detail,
                       const char* what) {
  TraceSpan span("collective", "AllToAllv");
  const CollectiveWatch watch("AllToAllv (hierarchical)", axes, group);
  if (span.on()) span.set_detail(detail);
  check_mpi(MPI_Alltoallv(send, send_counts.data(), send_displs.data(), mpi_type<T>(), recv,
                          recv_counts.data(), recv_displs.data(), mpi_type<T>(), group),
            what);
  std::int64_t sent = 0;
  for (std::size_t j = 0; j < send_counts.size(); ++j)
    if (static_cast<int>(j) != me) sent += send_counts[j];
  counted(span, axes, Collective::all_to_all_v, sent * std::int64_t{sizeof(T)});
}

/// The exchange of all_to_all_v over the group outer x inner (member j = jo * L + ji, L = size of
/// `inner`, N = size of `outer`), done in two steps:
///   1. intra-node, over `inner`: each rank sends to inner peer ji everything it has for the
///      members (0, ji), (1, ji), ..., (N-1, ji), one message grouped by destination node jo;
///   2. inter-node, over `outer`: each rank sends to outer peer jo one message holding the pieces
///      of all L inner sources for destination (jo, my ji), by source.
/// The result is exactly MPI_Alltoallv over the flat group where this rank is member
/// (rank in outer) * L + (rank in inner): counts and displacements in elements, in flat member
/// order, recv's pieces at recv_displs. `outer` connects the ranks with this one's inner index
/// and `inner` those with its outer index (Mesh::group of an outer axis and of an inner axis).
/// Step 1's sizes come from one AllToAll of N counts per pair within `inner` (a rank knows what
/// it sends and receives, not what its inner peers send to other nodes), counted as an AllToAll
/// under inner_axes; the steps count as AllToAllv under inner_axes and outer_axes, each with the
/// bytes sent to other ranks. Every byte crosses a node boundary at most once but is packed and
/// moved twice; with N == 1 or L == 1 this is one plain all_to_all_v. Buffers are host memory
/// (or memory the MPI library reads), as for all_to_all_v.
template <class T>
void all_to_all_v_hierarchical(const T* send, const std::vector<int>& send_counts,
                               const std::vector<int>& send_displs, T* recv,
                               const std::vector<int>& recv_counts,
                               const std::vector<int>& recv_displs, MPI_Comm inner, MPI_Comm outer,
                               const std::string& inner_axes, const std::string& outer_axes) {
  const int n_nodes = group_size(outer);
  const int per_node = group_size(inner);
  const auto members = static_cast<std::size_t>(n_nodes) * static_cast<std::size_t>(per_node);
  if (send_counts.size() != members || send_displs.size() != members ||
      recv_counts.size() != members || recv_displs.size() != members)
    throw Error("AllToAllv (hierarchical)",
                "counts and displacements must have one entry per member of the " +
                    std::to_string(n_nodes) + "x" + std::to_string(per_node) + " group, not " +
                    std::to_string(send_counts.size()));
  if (per_node == 1) {  // one rank per node: step 2 alone, already in flat order
    all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, outer, outer_axes);
    return;
  }
  if (n_nodes == 1) {  // one node: step 1 alone
    all_to_all_v(send, send_counts, send_displs, recv, recv_counts, recv_displs, inner, inner_axes);
    return;
  }
  const auto N = static_cast<std::size_t>(n_nodes);
  const auto L = static_cast<std::size_t>(per_node);
  int my_inner = 0;
  int my_outer = 0;
  MPI_Comm_rank(inner, &my_inner);
  MPI_Comm_rank(outer, &my_outer);
  auto flat = [L](std::size_t jo, std::size_t ji) { return jo * L + ji; };
  HierarchicalStaging<T>& staging = HierarchicalStaging<T>::instance();

  // What each inner source sends this rank in step 1, per destination node: from[si * N + jo]
  // elements travel (my node, si) -> (jo, my inner index).
  std::vector<std::int32_t> to(N * L);
  for (std::size_t ji = 0; ji < L; ++ji)
    for (std::size_t jo = 0; jo < N; ++jo) to[ji * N + jo] = send_counts[flat(jo, ji)];
  std::vector<std::int32_t> from(N * L);
  all_to_all(to.data(), from.data(), static_cast<std::int64_t>(N), inner, inner_axes);

  // Step 1: pack by inner peer, then node, and exchange within the node.
  std::vector<std::int64_t> sizes(L, 0);
  for (std::size_t ji = 0; ji < L; ++ji)
    for (std::size_t jo = 0; jo < N; ++jo) sizes[ji] += send_counts[flat(jo, ji)];
  std::vector<int> counts1_send, displs1_send, counts1_recv, displs1_recv;
  const std::int64_t packed_total =
      displacements_of(sizes, counts1_send, displs1_send, "AllToAllv (hierarchical, step 1)");
  std::fill(sizes.begin(), sizes.end(), 0);
  for (std::size_t si = 0; si < L; ++si)
    for (std::size_t jo = 0; jo < N; ++jo) sizes[si] += from[si * N + jo];
  const std::int64_t gathered_total =
      displacements_of(sizes, counts1_recv, displs1_recv, "AllToAllv (hierarchical, step 1)");
  T* packed = HierarchicalStaging<T>::sized(staging.packed, packed_total);
  T* gathered = HierarchicalStaging<T>::sized(staging.gathered, gathered_total);
  {
    T* out = packed;
    for (std::size_t ji = 0; ji < L; ++ji)
      for (std::size_t jo = 0; jo < N; ++jo) {
        const std::size_t j = flat(jo, ji);
        out = std::copy_n(send + send_displs[j], send_counts[j], out);
      }
  }
  hierarchical_step(packed, counts1_send, displs1_send, gathered, counts1_recv, displs1_recv, inner,
                    my_inner, inner_axes, "hierarchical step 1 (intra-node)",
                    "AllToAllv (hierarchical, step 1)");

  // Regroup by destination node, then inner source: one message per node.
  std::fill(sizes.begin(), sizes.end(), 0);
  sizes.resize(N, 0);
  for (std::size_t jo = 0; jo < N; ++jo)
    for (std::size_t si = 0; si < L; ++si) sizes[jo] += from[si * N + jo];
  std::vector<int> counts2_send, displs2_send;
  const std::int64_t regrouped_total =
      displacements_of(sizes, counts2_send, displs2_send, "AllToAllv (hierarchical, step 2)");
  T* regrouped = HierarchicalStaging<T>::sized(staging.regrouped, regrouped_total);
  {
    std::vector<std::int64_t> offset(N * L);  // gathered's piece (si, jo) starts at offset[si*N+jo]
    for (std::size_t si = 0, at = 0; si < L; ++si)
      for (std::size_t jo = 0; jo < N; ++jo) {
        offset[si * N + jo] = static_cast<std::int64_t>(at);
        at += static_cast<std::size_t>(from[si * N + jo]);
      }
    T* out = regrouped;
    for (std::size_t jo = 0; jo < N; ++jo)
      for (std::size_t si = 0; si < L; ++si)
        out = std::copy_n(gathered + offset[si * N + jo], from[si * N + jo], out);
  }

  // Step 2 receives, from node so, the pieces of sources (so, 0..L-1): flat order. When
  // recv_displs keep each node's pieces contiguous and in order, they land in place.
  std::vector<int> counts2_recv(N), displs2_recv(N);
  bool in_place = true;
  for (std::size_t so = 0; so < N && in_place; ++so) {
    std::int64_t start = -1;
    std::int64_t next = 0;
    for (std::size_t si = 0; si < L; ++si) {
      const std::size_t j = flat(so, si);
      if (recv_counts[j] == 0) continue;
      if (start < 0) start = next = recv_displs[j];
      if (recv_displs[j] != next) in_place = false;
      next += recv_counts[j];
    }
    counts2_recv[so] =
        mpi_count(next - std::max<std::int64_t>(start, 0), "AllToAllv (hierarchical, step 2)");
    displs2_recv[so] = static_cast<int>(std::max<std::int64_t>(start, 0));
  }
  T* landing = recv;
  if (!in_place) {
    std::fill(sizes.begin(), sizes.end(), 0);
    for (std::size_t so = 0; so < N; ++so)
      for (std::size_t si = 0; si < L; ++si) sizes[so] += recv_counts[flat(so, si)];
    const std::int64_t total =
        displacements_of(sizes, counts2_recv, displs2_recv, "AllToAllv (hierarchical, step 2)");
    landing = HierarchicalStaging<T>::sized(staging.received, total);
  }
  hierarchical_step(regrouped, counts2_send, displs2_send, landing, counts2_recv, displs2_recv,
                    outer, my_outer, outer_axes, "hierarchical step 2 (inter-node)",
                    "AllToAllv (hierarchical, step 2)");
  if (!in_place) {
    const T* in = landing;
    for (std::size_t j = 0; j < N * L; ++j) {
      std::copy_n(in, recv_counts[j], recv + recv_displs[j]);
      in += recv_counts[j];
    }
  }
}

}  // namespace gshard::detail
