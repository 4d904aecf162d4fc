#pragma once
// MPI collectives over buffers that MPI can read (host memory, or device memory with a
// device-aware MPI), each counted in comm_counters().
#include <mpi.h>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "../core/error.hpp"
#include "../core/trace.hpp"
#include "counters.hpp"
#include "watchdog.hpp"

namespace gshard::detail {

template <class T>
MPI_Datatype mpi_type() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else
    static_assert(sizeof(T) == 0, "gshard: element type must be float, double, int32_t or int64_t");
}

enum class ReduceOp { sum, max, min };

inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return MPI_SUM;
    case ReduceOp::max:
      return MPI_MAX;
    case ReduceOp::min:
      return MPI_MIN;
  }
  return MPI_SUM;
}

inline void check_mpi(int code, const char* what) {
  if (code != MPI_SUCCESS) throw Error(what, "MPI returned error code " + std::to_string(code));
}

inline int mpi_count(std::int64_t n, const char* what) {
  if (n > INT32_MAX)
    throw Error(what, "a message of " + std::to_string(n) + " elements exceeds MPI's int count");
  return static_cast<int>(n);
}

inline int group_size(MPI_Comm comm) {
  int k = 1;
  MPI_Comm_size(comm, &k);
  return k;
}

/// Counts a finished collective, and traces it when `span` records.
inline void counted(TraceSpan& span, const std::string& axes, Collective kind, std::int64_t bytes) {
  CommCountersAccess::add(comm_counters(), axes, kind, bytes);
  if (span.on()) span.set_collective(axes, bytes);
}

/// recv[k * n] = every rank's send[n], in group-rank order.
template <class T>
void all_gather(const T* send, T* recv, std::int64_t n, MPI_Comm comm, const std::string& axes) {
  TraceSpan span("collective", "AllGather");
  const CollectiveWatch watch("AllGather", axes, comm);
  const int k = group_size(comm);
  check_mpi(MPI_Allgather(send, mpi_count(n, "AllGather"), mpi_type<T>(), recv,
                          mpi_count(n, "AllGather"), mpi_type<T>(), comm),
            "AllGather");
  counted(span, axes, Collective::all_gather, (k - 1) * n * std::int64_t{sizeof(T)});
}

/// send[k][n] -> recv[k][n]: block j goes to group rank j.
template <class T>
void all_to_all(const T* send, T* recv, std::int64_t n, MPI_Comm comm, const std::string& axes) {
  TraceSpan span("collective", "AllToAll");
  const CollectiveWatch watch("AllToAll", axes, comm);
  const int k = group_size(comm);
  check_mpi(MPI_Alltoall(send, mpi_count(n, "AllToAll"), mpi_type<T>(), recv,
                         mpi_count(n, "AllToAll"), mpi_type<T>(), comm),
            "AllToAll");
  counted(span, axes, Collective::all_to_all, (k - 1) * n * std::int64_t{sizeof(T)});
}

/// Variable-size exchange; counts and displacements in elements.
template <class T>
void all_to_all_v(const T* send, const std::vector<int>& send_counts,
                  const std::vector<int>& send_displs, T* recv, const std::vector<int>& recv_counts,
                  const std::vector<int>& recv_displs, MPI_Comm comm, const std::string& axes) {
  TraceSpan span("collective", "AllToAllv");
  const CollectiveWatch watch("AllToAllv", axes, comm);
  int me = 0;
  MPI_Comm_rank(comm, &me);
  check_mpi(MPI_Alltoallv(send, send_counts.data(), send_displs.data(), mpi_type<T>(), recv,
                          recv_counts.data(), recv_displs.data(), mpi_type<T>(), comm),
            "AllToAllv");
  std::int64_t sent = 0;
  for (std::size_t j = 0; j < send_counts.size(); ++j)
    if (static_cast<int>(j) != me) sent += send_counts[j];
  counted(span, axes, Collective::all_to_all_v, sent * std::int64_t{sizeof(T)});
}

/// In place over n elements.
template <class T>
void all_reduce(T* data, std::int64_t n, ReduceOp op, MPI_Comm comm, const std::string& axes) {
  TraceSpan span("collective", "AllReduce");
  const CollectiveWatch watch("AllReduce", axes, comm);
  const int k = group_size(comm);
  check_mpi(
      MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(n, "AllReduce"), mpi_type<T>(), mpi_op(op), comm),
      "AllReduce");
  counted(span, axes, Collective::all_reduce, 2 * (k - 1) * n * std::int64_t{sizeof(T)} / k);
}

/// send[k][n] reduced over the group; group rank j keeps block j in recv[n].
template <class T>
void reduce_scatter(const T* send, T* recv, std::int64_t n, ReduceOp op, MPI_Comm comm,
                    const std::string& axes) {
  TraceSpan span("collective", "ReduceScatter");
  const CollectiveWatch watch("ReduceScatter", axes, comm);
  const int k = group_size(comm);
  check_mpi(MPI_Reduce_scatter_block(send, recv, mpi_count(n, "ReduceScatter"), mpi_type<T>(),
                                     mpi_op(op), comm),
            "ReduceScatter");
  counted(span, axes, Collective::reduce_scatter, (k - 1) * n * std::int64_t{sizeof(T)});
}

/// Sends n elements to `dest` and receives n from `source` (ranks of comm).
template <class T>
void permute(const T* send, T* recv, std::int64_t n, int dest, int source, MPI_Comm comm,
             const std::string& axes) {
  TraceSpan span("collective", "CollectivePermute");
  const CollectiveWatch watch("CollectivePermute", axes, comm);
  int me = 0;
  MPI_Comm_rank(comm, &me);
  check_mpi(MPI_Sendrecv(send, mpi_count(n, "CollectivePermute"), mpi_type<T>(), dest, 0, recv,
                         mpi_count(n, "CollectivePermute"), mpi_type<T>(), source, 0, comm,
                         MPI_STATUS_IGNORE),
            "CollectivePermute");
  counted(span, axes, Collective::permute, dest == me ? 0 : n * std::int64_t{sizeof(T)});
}

/// Sends n_send elements to `dest` and receives n_recv from `source`; either may be
/// MPI_PROC_NULL (a halo exchange at the edge of the mesh). Counted as a CollectivePermute with
/// the bytes actually sent to another rank.
template <class T>
void send_recv(const T* send, std::int64_t n_send, int dest, T* recv, std::int64_t n_recv,
               int source, MPI_Comm comm, const std::string& axes) {
  TraceSpan span("collective", "CollectivePermute");
  const CollectiveWatch watch("CollectivePermute", axes, comm);
  int me = 0;
  MPI_Comm_rank(comm, &me);
  check_mpi(MPI_Sendrecv(send, mpi_count(n_send, "CollectivePermute"), mpi_type<T>(), dest, 1, recv,
                         mpi_count(n_recv, "CollectivePermute"), mpi_type<T>(), source, 1, comm,
                         MPI_STATUS_IGNORE),
            "CollectivePermute");
  const bool sends = dest != MPI_PROC_NULL && dest != me;
  counted(span, axes, Collective::permute, sends ? n_send * std::int64_t{sizeof(T)} : 0);
}

/// Exclusive prefix reduction over the group, element-wise over n values: group rank r gets the
/// combination of ranks 0..r-1 (rank 0: the identity `first`, which MPI leaves undefined).
template <class T>
void exscan(const T* send, T* recv, std::int64_t n, ReduceOp op, T first, MPI_Comm comm,
            const std::string& axes) {
  TraceSpan span("collective", "ExScan");
  const CollectiveWatch watch("ExScan", axes, comm);
  int me = 0;
  MPI_Comm_rank(comm, &me);
  check_mpi(MPI_Exscan(send, recv, mpi_count(n, "ExScan"), mpi_type<T>(), mpi_op(op), comm),
            "ExScan");
  if (me == 0)
    for (std::int64_t i = 0; i < n; ++i) recv[i] = first;
  const int k = group_size(comm);
  counted(span, axes, Collective::exscan, me + 1 < k ? n * std::int64_t{sizeof(T)} : 0);
}

}  // namespace gshard::detail
