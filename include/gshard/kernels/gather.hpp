#pragma once
// The local kernels of the index ops (ops/index.hpp): gather (the lookup of take and take_along)
// and scatter_into (the adds of scatter_add and scatter_add_along), row by row
// (kernels/rows.hpp), over a GatherMap that relates a loop block to two other local blocks.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <string>

#include "../core/layout.hpp"
#include "math.hpp"
#include "rows.hpp"

namespace gshard {
namespace detail {
namespace index_ops {

/// One loop over a block: its extents and validity, and for each of its dimensions the stride
/// of the same label in two other local blocks (0 where they lack it).
struct GatherMap {
  int rank = 0;
  std::int64_t extent[max_dims]{};
  std::int64_t valid[max_dims]{};
  std::int64_t a_stride[max_dims]{};
  std::int64_t b_stride[max_dims]{};
  std::int64_t v_stride = 0;  // the indexed label's local stride
  std::int64_t v_offset = 0;  // its global offset on this rank
  std::int64_t v_valid = 0;   // its valid extent on this rank
};

/// Both loops below walk rows of the last (contiguous) dimension: one index decode per row
/// (divisions are the cost of a per-element decode), then a strided inner loop. Returns true when
/// the row lies in padding; ia and ib are the row's a- and b-offsets.
KOKKOS_INLINE_FUNCTION bool decode_row(const GatherMap& m, std::int64_t row, std::int64_t& ia,
                                       std::int64_t& ib) {
  std::int64_t rest = row;
  bool pad = false;
  ia = 0;
  ib = 0;
  for (int d = m.rank - 2; d >= 0; --d) {
    const std::int64_t c = rest % m.extent[d];
    rest /= m.extent[d];
    pad = pad || c >= m.valid[d];
    ia += c * m.a_stride[d];
    ib += c * m.b_stride[d];
  }
  return pad;
}

/// The last dimension's extent, valid extent and strides (a rank-0 block is one row of one).
struct RowShape {
  std::int64_t inner = 1, valid = 1, a_stride = 0, b_stride = 0;
};

inline RowShape row_shape(const GatherMap& m) {
  if (m.rank == 0) return {};
  const int last = m.rank - 1;
  return {m.extent[last], m.valid[last], m.a_stride[last], m.b_stride[last]};
}

/// The lookup of take and take_along, row by row (kernels/rows.hpp): every element of a local
/// block is written (padding zero); an element reads the index at its a-offset and the table row
/// at its b-offset plus (index - v_offset) * v_stride, or is zero when the index falls outside
/// this rank's [0, v_valid) of the indexed label (another copy holds it, or it is negative).
/// What both row kernels below start a row with: its a- and b-offsets, and whether it is padding.
struct DecodedRows {
  GatherMap m;
  RowShape r;
  struct State {
    std::int64_t row, ia, ib;
    bool pad;
  };
  KOKKOS_INLINE_FUNCTION State begin(const std::int64_t row) const {
    State s{row, 0, 0, false};
    s.pad = decode_row(m, row, s.ia, s.ib);
    return s;
  }
};

template <class T, class I>
struct GatherRows : DecodedRows {
  Kokkos::View<I*> iv;
  Kokkos::View<T*> tv, o;
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State&) const { return r.inner; }
  KOKKOS_INLINE_FUNCTION void element(const State& s, const std::int64_t j) const {
    T value{};
    if (!s.pad && j < r.valid) {
      const std::int64_t v = static_cast<std::int64_t>(iv(s.ia + j * r.a_stride)) - m.v_offset;
      if (v >= 0 && v < m.v_valid) value = tv(s.ib + j * r.b_stride + v * m.v_stride);
    }
    o(s.row * r.inner + j) = value;
  }
};

template <class T, class I>
Kokkos::View<T*> gather(const char* name, const GatherMap& m, std::int64_t size,
                        const Kokkos::View<I*>& iv, const Kokkos::View<T*>& tv) {
  Kokkos::View<T*> o(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing),
                     static_cast<std::size_t>(size));
  const RowShape r = row_shape(m);
  const std::int64_t rows = r.inner > 0 ? size / r.inner : 0;
  for_each_row(name, rows, GatherRows<T, I>{{m, r}, iv, tv, o});
  return o;
}

/// The adds of scatter_add and scatter_add_along, row by row: each valid value is added at its
/// b-offset plus (index - v_offset) * v_stride of `o` when the index at its a-offset falls in
/// this rank's [0, v_valid) (negative indices add nothing). Rows may add into the same place.
template <class T, class I>
struct ScatterRows : DecodedRows {
  Kokkos::View<T*> o;
  Kokkos::View<I*> iv;
  Kokkos::View<T*> vv;
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State& s) const {
    return s.pad ? 0 : r.valid;  // padding adds nothing
  }
  template <bool Atomic = true>
  KOKKOS_INLINE_FUNCTION void element(const State& s, const std::int64_t j) const {
    const std::int64_t v = static_cast<std::int64_t>(iv(s.ia + j * r.a_stride)) - m.v_offset;
    if (v < 0 || v >= m.v_valid) return;
    T& target = o(s.ib + j * r.b_stride + v * m.v_stride);
    if constexpr (Atomic)
      add_to(target, vv(s.row * r.inner + j));
    else
      target += vv(s.row * r.inner + j);
  }
};

/// The host path of scatter_into: part p adds columns [j0, j1) of the innermost label of every
/// row, rows in order. Columns of a label the target has are distinct target elements, so no
/// two parts meet: no atomics, and each element's sum is taken in row order whatever the thread
/// count (bitwise repeatable, as on Serial).
template <class T, class I>
struct ScatterColumns {
  ScatterRows<T, I> k;
  std::int64_t rows, parts;
  KOKKOS_INLINE_FUNCTION void operator()(const std::int64_t p) const {
    const std::int64_t j0 = k.r.valid * p / parts, j1 = k.r.valid * (p + 1) / parts;
    for (std::int64_t row = 0; row < rows; ++row) {
      const auto s = k.begin(row);
      if (s.pad) continue;
      for (std::int64_t j = j0; j < j1; ++j) k.template element<false>(s, j);
    }
  }
};

template <class T, class I>
void scatter_into(const char* name, const GatherMap& m, std::int64_t size,
                  const Kokkos::View<T*>& o, const Kokkos::View<I*>& iv,
                  const Kokkos::View<T*>& vv) {
  const RowShape r = row_shape(m);
  const std::int64_t rows = r.inner > 0 ? size / r.inner : 0;
  const ScatterRows<T, I> k{{m, r}, o, iv, vv};
  if (row_teams()) {
    // Devices: one team per row, atomic adds (their order, and so the last bits, may vary).
    for_each_row(name, rows, k);
    return;
  }
  // The innermost label splits over the threads only when the target has it (else every column
  // adds into the same elements: one part).
  const std::int64_t threads = Kokkos::DefaultExecutionSpace().concurrency();
  const std::int64_t parts =
      r.b_stride != 0 ? std::max<std::int64_t>(1, std::min(threads, r.valid)) : 1;
  if (rows > 0)
    Kokkos::parallel_for(name, Kokkos::RangePolicy<>(0, parts),
                         ScatterColumns<T, I>{k, rows, parts});
}

}  // namespace index_ops
}  // namespace detail
}  // namespace gshard
