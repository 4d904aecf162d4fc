#pragma once
// The one data-movement kernel of resharding: copy a box between two row-major arrays whose
// dimensions may come in different orders. Packing, unpacking, slicing and transposing are all
// this kernel with other arguments.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../core/layout.hpp"

namespace gshard::detail {

struct BoxCopy {
  int rank = 0;                         // dimensions, in destination order
  std::int64_t box[max_dims]{};         // box extent per destination dim
  std::int64_t dst_start[max_dims]{};   // box origin in the destination, per destination dim
  std::int64_t dst_stride[max_dims]{};  // destination strides, per destination dim
  std::int64_t src_start[max_dims]{};   // box origin in the source, per destination dim
  std::int64_t src_stride[max_dims]{};  // source strides of the matching source dim

  [[nodiscard]] std::int64_t volume() const {
    std::int64_t v = 1;
    for (int d = 0; d < rank; ++d) v *= box[d];
    return v;
  }
};

/// `c` with its dimensions of extent 1 folded into the start offsets, and neighbours that are
/// contiguous in both arrays merged, so the innermost dimension is as long a run as possible.
inline BoxCopy collapsed(const BoxCopy& c, std::int64_t& src_offset, std::int64_t& dst_offset) {
  BoxCopy o;
  src_offset = 0;
  dst_offset = 0;
  for (int d = 0; d < c.rank; ++d) {
    if (c.box[d] == 1) {  // a single index: a constant offset
      src_offset += c.src_start[d] * c.src_stride[d];
      dst_offset += c.dst_start[d] * c.dst_stride[d];
      continue;
    }
    if (o.rank > 0) {
      const int p = o.rank - 1;
      if (o.src_stride[p] == c.src_stride[d] * c.box[d] &&
          o.dst_stride[p] == c.dst_stride[d] * c.box[d]) {
        o.src_start[p] = o.src_start[p] * c.box[d] + c.src_start[d];
        o.dst_start[p] = o.dst_start[p] * c.box[d] + c.dst_start[d];
        o.box[p] *= c.box[d];
        o.src_stride[p] = c.src_stride[d];
        o.dst_stride[p] = c.dst_stride[d];
        continue;
      }
    }
    const int q = o.rank++;
    o.box[q] = c.box[d];
    o.src_start[q] = c.src_start[d];
    o.dst_start[q] = c.dst_start[d];
    o.src_stride[q] = c.src_stride[d];
    o.dst_stride[q] = c.dst_stride[d];
  }
  return o;
}

/// dst[box] = src[box], where `dst` and `src` are flat views (or pointers) into row-major data.
/// When the innermost (collapsed) dimension is contiguous on both sides, one work item copies
/// one contiguous run, so the index arithmetic is paid per run, not per element.
template <class T>
void copy_box(const T* src, T* dst, const BoxCopy& box) {
  std::int64_t so = 0;
  std::int64_t to = 0;
  const BoxCopy c = collapsed(box, so, to);
  const std::int64_t n = c.volume();
  if (n == 0 || box.volume() == 0) return;
  src += so;
  dst += to;
  const int last = c.rank - 1;
  if (c.rank == 0 || (c.src_stride[last] == 1 && c.dst_stride[last] == 1)) {
    const std::int64_t run = c.rank == 0 ? 1 : c.box[last];
    if constexpr (std::is_same_v<Kokkos::DefaultExecutionSpace::memory_space, Kokkos::HostSpace> &&
                  std::is_trivially_copyable_v<T>) {
      // Host memory: each run is a memcpy, the fastest copy the C library has.
      Kokkos::parallel_for(
          "gshard::copy_box", Kokkos::RangePolicy<Kokkos::DefaultHostExecutionSpace>(0, n / run),
          [=](std::int64_t i) {
            std::int64_t s = last >= 0 ? c.src_start[last] : 0;
            std::int64_t t = last >= 0 ? c.dst_start[last] : 0;
            for (int d = last - 1; d >= 0; --d) {
              const std::int64_t k = i % c.box[d];
              i /= c.box[d];
              s += (c.src_start[d] + k) * c.src_stride[d];
              t += (c.dst_start[d] + k) * c.dst_stride[d];
            }
            std::memcpy(dst + t, src + s, static_cast<std::size_t>(run) * sizeof(T));
          });
      return;
    }
    Kokkos::parallel_for(
        "gshard::copy_box", Kokkos::RangePolicy<>(0, n / run), KOKKOS_LAMBDA(std::int64_t i) {
          std::int64_t s = last >= 0 ? c.src_start[last] : 0;
          std::int64_t t = last >= 0 ? c.dst_start[last] : 0;
          for (int d = last - 1; d >= 0; --d) {
            const std::int64_t k = i % c.box[d];
            i /= c.box[d];
            s += (c.src_start[d] + k) * c.src_stride[d];
            t += (c.dst_start[d] + k) * c.dst_stride[d];
          }
          for (std::int64_t j = 0; j < run; ++j) dst[t + j] = src[s + j];
        });
    return;
  }
  if (c.rank == 1) {
    // One strided run (a column of a row-major block, as halo exchanges pack): no index decode.
    const std::int64_t s0 = c.src_start[0] * c.src_stride[0], ss = c.src_stride[0];
    const std::int64_t t0 = c.dst_start[0] * c.dst_stride[0], ts = c.dst_stride[0];
    Kokkos::parallel_for(
        "gshard::copy_box", Kokkos::RangePolicy<>(0, n),
        KOKKOS_LAMBDA(std::int64_t i) { dst[t0 + i * ts] = src[s0 + i * ss]; });
    return;
  }
  Kokkos::parallel_for(
      "gshard::copy_box", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::int64_t i) {
        std::int64_t s = 0;
        std::int64_t t = 0;
        for (int d = c.rank - 1; d >= 0; --d) {
          const std::int64_t k = i % c.box[d];
          i /= c.box[d];
          s += (c.src_start[d] + k) * c.src_stride[d];
          t += (c.dst_start[d] + k) * c.dst_stride[d];
        }
        dst[t] = src[s];
      });
}

/// Row-major strides of extents `e`.
inline void row_major_strides(int rank, const std::int64_t* e, std::int64_t* stride) {
  std::int64_t s = 1;
  for (int d = rank - 1; d >= 0; --d) {
    stride[d] = s;
    s *= e[d];
  }
}

}  // namespace gshard::detail
