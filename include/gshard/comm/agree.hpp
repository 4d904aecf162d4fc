#pragma once
// Errors that only some ranks see (a file they failed to read, a check on their own shard) made
// into the same gshard::Error on every rank, so that no rank waits in a collective for a rank
// that has thrown.
#include <mpi.h>

#include <exception>
#include <string>
#include <string_view>
#include <utility>

#include "../core/error.hpp"
#include "watchdog.hpp"

namespace gshard::detail {

/// Collective over `comm`: the `message` of the lowest rank that passed a non-empty one, on
/// every rank; empty when none did. One AllReduce when all are empty.
inline std::string first_message(MPI_Comm comm, const std::string& message) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  int first = message.empty() ? size : rank;
  const CollectiveWatch watch("AllReduce and Bcast (agreeing on an error)", "", comm);
  MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, comm);
  if (first == size) return {};
  std::string text = rank == first ? message : std::string();
  int length = static_cast<int>(text.size());
  MPI_Bcast(&length, 1, MPI_INT, first, comm);
  text.resize(static_cast<std::size_t>(length));
  MPI_Bcast(text.data(), length, MPI_CHAR, first, comm);
  return text;
}

/// Collective: when some rank passes a non-empty `error`, every rank throws
/// gshard::Error(op, that error) with the lowest such rank's text.
inline void agree(MPI_Comm comm, std::string_view op, const std::string& error) {
  const std::string e = first_message(comm, error);
  if (!e.empty()) throw Error(op, e);
}

/// Runs f() on every rank and agrees on the outcome: when it threw somewhere (gshard::Error or
/// any std::exception), every rank throws the lowest such rank's error, with its op. f must not
/// call collectives that other ranks could skip by throwing first.
template <class F>
void agree_on(MPI_Comm comm, std::string_view op, F&& f) {
  std::string error;
  try {
    std::forward<F>(f)();
  } catch (const Error& e) {
    error = std::string(e.op()).append("\n").append(e.detail());
  } catch (const std::exception& e) {
    error = std::string(op).append("\n").append(*e.what() ? e.what() : "unknown error");
  }
  const std::string e = first_message(comm, error);
  if (e.empty()) return;
  const auto cut = e.find('\n');
  throw Error(e.substr(0, cut), e.substr(cut + 1));
}

}  // namespace gshard::detail
