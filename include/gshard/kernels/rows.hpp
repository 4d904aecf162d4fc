#pragma once
// Row kernels that fit each backend. Most local ops walk rows of a block (the last dimension, or
// the reduced labels): on a host execution space one iteration per row with the row's loop in
// order (one index decode per row, the row stays in cache); on a device one team per row whose
// threads split the row (coalesced loads, and a long row is not one thread's serial loop).
//
// A row kernel K provides
//   State begin(std::int64_t row) const;                  per-row setup (offsets, an evaluator)
//   std::int64_t length(const State&) const;              elements of the row
//   void element(const State&, std::int64_t j) const;     for_each_row: the work on element j
// and for reduce_rows also
//   Acc term(const State&, std::int64_t j) const;         element j's contribution
//   void finish(std::int64_t row, const State&, const Acc&) const;
//   optionally void walk(const State&, Acc&) const: the host path's in-order loop
// with Acc's identity, combine and tie rules in K::Reduce (see RowReducer).
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <type_traits>

namespace gshard::detail {

/// Whether row kernels run as one team per row: on device execution spaces; on the host too when
/// GSHARD_ROW_TEAMS=1 (the tests run the device path on the CPU backends that way).
inline bool row_teams() {
  if constexpr (!std::is_same_v<Kokkos::DefaultExecutionSpace, Kokkos::DefaultHostExecutionSpace>) {
    return true;
  } else {
    static const bool forced = [] {
      const char* e = std::getenv("GSHARD_ROW_TEAMS");
      return e != nullptr && std::string_view(e) == "1";
    }();
    return forced;
  }
}

template <class K>
struct RowLoop {
  K k;
  using Member = Kokkos::TeamPolicy<>::member_type;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t row) const {
    const auto s = k.begin(row);
    if constexpr (requires { k.walk(s); }) {
      k.walk(s);  // the kernel's own in-order loop (branch-free, vectorisable)
    } else {
      const std::int64_t n = k.length(s);
      for (std::int64_t j = 0; j < n; ++j) k.element(s, j);
    }
  }
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const auto s = k.begin(static_cast<std::int64_t>(team.league_rank()));
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, k.length(s)),
                         [&](const std::int64_t j) { k.element(s, j); });
  }
};

/// Runs a functor with both paths (operator()(row) and operator()(team member)) over `rows`.
template <class Loop>
void run_rows(const char* name, std::int64_t rows, const Loop& loop) {
  if (rows <= 0) return;
  if (row_teams())
    Kokkos::parallel_for(name, Kokkos::TeamPolicy<>(static_cast<int>(rows), Kokkos::AUTO), loop);
  else
    Kokkos::parallel_for(name, Kokkos::RangePolicy<>(0, rows), loop);
}

/// k.element(s, j) for every element j of every row (s = k.begin(row)).
template <class K>
void for_each_row(const char* name, std::int64_t rows, const K& k) {
  run_rows(name, rows, RowLoop<K>{k});
}

/// A Kokkos reducer over a row kernel's accumulator: K::Reduce gives identity() and
/// combine(dest, src). Written for Kokkos 3.4 (volatile joins) and 4.x/5.x alike.
template <class Reduce>
struct RowReducer {
  using reducer = RowReducer;
  using value_type = typename Reduce::Acc;
  using result_view_type = Kokkos::View<value_type, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>;
  value_type& value;
  KOKKOS_INLINE_FUNCTION explicit RowReducer(value_type& v) : value(v) {}
  KOKKOS_INLINE_FUNCTION void join(value_type& dest, const value_type& src) const {
    Reduce::combine(dest, src);
  }
#if KOKKOS_VERSION < 40000
  KOKKOS_INLINE_FUNCTION void join(volatile value_type& dest,
                                   const volatile value_type& src) const {
    value_type d = const_cast<const value_type&>(dest);
    Reduce::combine(d, const_cast<const value_type&>(src));
    const_cast<value_type&>(dest) = d;
  }
#endif
  KOKKOS_INLINE_FUNCTION void init(value_type& v) const { v = Reduce::identity(); }
  KOKKOS_INLINE_FUNCTION value_type& reference() const { return value; }
  KOKKOS_INLINE_FUNCTION result_view_type view() const { return result_view_type(&value); }
  KOKKOS_INLINE_FUNCTION bool references_scalar() const { return true; }
};

template <class K>
struct RowReduceLoop {
  K k;
  using Reduce = typename K::Reduce;
  using Acc = typename Reduce::Acc;
  using Member = Kokkos::TeamPolicy<>::member_type;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t row) const {
    const auto s = k.begin(row);
    Acc acc = Reduce::identity();
    if constexpr (requires { k.walk(s, acc); }) {
      k.walk(s, acc);  // the kernel's own in-order loop (no per-element index decode)
    } else {
      const std::int64_t n = k.length(s);
      for (std::int64_t j = 0; j < n; ++j) Reduce::combine(acc, k.term(s, j));
    }
    k.finish(row, s, acc);
  }
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t row = team.league_rank();
    const auto s = k.begin(row);
    Acc acc = Reduce::identity();
    Kokkos::parallel_reduce(
        Kokkos::TeamThreadRange(team, k.length(s)),
        [&](const std::int64_t j, Acc& a) { Reduce::combine(a, k.term(s, j)); },
        RowReducer<Reduce>(acc));
    Kokkos::single(Kokkos::PerTeam(team), [&]() { k.finish(row, s, acc); });
  }
};

/// For every row: k.finish(row, s, the combination of k.term(s, j) over the row's elements).
/// The combination order differs between the two paths, so it must not matter beyond rounding
/// (sums) or must be made exact by the tie rules (arg-max/min).
template <class K>
void reduce_rows(const char* name, std::int64_t rows, const K& k) {
  run_rows(name, rows, RowReduceLoop<K>{k});
}

}  // namespace gshard::detail
