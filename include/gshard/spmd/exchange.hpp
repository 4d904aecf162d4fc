#pragma once
// The one AllToAllv path of the library: reshard's redistribute step (spmd/reshard.hpp) and the
// shape ops' interval exchange (spmd/interval.hpp) both count, pack, exchange and unpack through
// it, staging in the same reused workspace.
#include <Kokkos_Core.hpp>
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "../comm/collectives.hpp"
#include "../comm/mpi_access.hpp"

namespace gshard {

namespace detail {

/// Asks the kernel to back the 2 MiB-aligned interior of a fresh host allocation with huge
/// pages (Linux transparent huge pages in "madvise" mode), before anything touches it: the first
/// touch of a large result then takes one fault per 2 MiB instead of one per 4 KiB.
template <class T>
void advise_huge_pages(const Kokkos::View<T*>& v) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  using Space = typename Kokkos::View<T*>::memory_space;
  if constexpr (std::is_same_v<Space, Kokkos::HostSpace>) {
    constexpr std::uintptr_t huge = std::uintptr_t{2} << 20;
    const auto begin = reinterpret_cast<std::uintptr_t>(v.data());
    const std::uintptr_t first = (begin + huge - 1) & ~(huge - 1);
    const std::uintptr_t last = (begin + v.extent(0) * sizeof(T)) & ~(huge - 1);
    if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
  }
#else
  (void)v;
#endif
}

/// The send and receive staging buffers (slot 0 and 1) of reshard's steps and of the AllToAllv
/// below, kept between calls and grown on demand, so an exchange in a loop neither allocates nor
/// first-touches them again. Released when Kokkos finalises. MPI is funneled through one thread,
/// so one set per element type does. A view handed out is valid until the next call for its slot.
template <class T>
Kokkos::View<T*> workspace(int slot, std::int64_t n) {
  static std::array<Kokkos::View<T*>, 2> views;
  static const bool hooked = [] {
    Kokkos::push_finalize_hook([] { views = {}; });
    return true;
  }();
  (void)hooked;
  Kokkos::View<T*>& v = views[static_cast<std::size_t>(slot)];
  if (static_cast<std::int64_t>(v.extent(0)) < n) {
    v = Kokkos::View<T*>();
    v = Kokkos::View<T*>(
        Kokkos::view_alloc(std::string("gshard::reshard::workspace"), Kokkos::WithoutInitializing),
        n);
    advise_huge_pages(v);
  }
  return Kokkos::View<T*>(v.data(), n);  // unmanaged: the cache owns the memory
}

/// The element counts and displacements of one AllToAllv over a group of k members: member j's
/// piece from this rank sits at send_displs[j] of the send buffer, its piece to this rank at
/// recv_displs[j] of the receive buffer, pieces in member order.
struct AllToAllvCounts {
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  std::int64_t send_total = 0;
  std::int64_t recv_total = 0;

  explicit AllToAllvCounts(int k)
      : send_counts(static_cast<std::size_t>(k), 0),
        send_displs(static_cast<std::size_t>(k), 0),
        recv_counts(static_cast<std::size_t>(k), 0),
        recv_displs(static_cast<std::size_t>(k), 0) {}

  /// Member j (each once, in increasing order) gets `sent` elements and gives `received`;
  /// `what` names the exchange when a count does not fit MPI's int.
  void add(int j, std::int64_t sent, std::int64_t received, const char* what) {
    const auto ju = static_cast<std::size_t>(j);
    send_counts[ju] = mpi_count(sent, what);
    recv_counts[ju] = mpi_count(received, what);
    send_displs[ju] = mpi_count(send_total, what);
    recv_displs[ju] = mpi_count(recv_total, what);
    send_total += sent;
    recv_total += received;
  }
};

/// One AllToAllv over `group` (`axes` names it for counters and traces): `pack(T* send)` writes
/// every member's piece at its send displacement, the exchange runs through MpiAccess (host
/// mirrors, or the device buffers themselves with a device-aware MPI), then `unpack(const T*
/// recv)` reads every member's piece at its receive displacement. Both buffers are the
/// workspace (slots 0 and 1): nothing is allocated once they are large enough.
template <class T, class Pack, class Unpack>
void all_to_all_v_staged(const AllToAllvCounts& c, MPI_Comm group, const std::string& axes,
                         Pack&& pack, Unpack&& unpack) {
  const Kokkos::View<T*> send = workspace<T>(0, c.send_total);
  const Kokkos::View<T*> recv = workspace<T>(1, c.recv_total);
  pack(send.data());
  {
    MpiAccess<T> src(send, true);
    MpiAccess<T> dst(recv, false);
    all_to_all_v(src.data(), c.send_counts, c.send_displs, dst.data(), c.recv_counts, c.recv_displs,
                 group, axes);
    dst.copy_out();
  }
  unpack(static_cast<const T*>(recv.data()));
}

}  // namespace detail
}  // namespace gshard
