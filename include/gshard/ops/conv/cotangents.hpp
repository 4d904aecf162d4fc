#pragma once
// The backward passes of conv and pooling: the input's cotangent (a transposed convolution on
// the widened block, then the halo returned to its owners) and the weights' (a correlation of
// the widened input with the cotangent, partial over the axes that split the sum).
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "../../spmd/halo.hpp"
#include "../../tensor/sharded.hpp"
#include "forward.hpp"
#include "rules.hpp"

namespace gshard {
namespace detail {

/// `base` without partials, then partial over the axes in `mask` (in mesh order).
inline Layout conv_with_partials(const Layout& base, unsigned mask) {
  Layout l = finished_layout(base);
  for (int a = 0; a < max_axes; ++a)
    if (mask & (1u << a)) l.partial[static_cast<std::size_t>(l.partial_count++)] = a;
  return l;
}

/// The cotangent of a conv's input: the transposed convolution of g with the weights, computed
/// on the widened block (each element gathers from the output positions whose windows read
/// it, within this rank's output block), then the halo returned and added to its owners. Summed
/// over this rank's output channels only: partial over O's axes (and over g's own partials).
template <class T>
RuntimeTensor<T> conv_input_cotangent(const ConvSpec& spec, const ConvSaved<T>& sv,
                                      const RuntimeTensor<T>& g, const MeshState& mesh,
                                      const std::vector<std::string>& axis_names) {
  const Layout& xl = sv.rules.input;
  const Layout& wl = sv.rules.weights;
  const int rank = xl.rank;
  const int ns = spec.spatial_count;
  const int dc = xl.find(spec.in_channel);
  const auto dcu = static_cast<std::size_t>(dc);
  const Shape hext = sv.halo.extents;
  const Shape gext = local_extents(g.layout, g.shape, mesh.sizes);
  const Shape w_ext = local_extents(wl, sv.w_shape, mesh.sizes);
  std::int64_t gs_raw[max_dims]{}, ws_raw[max_dims]{};
  row_major_strides(rank, gext.data(), gs_raw);
  row_major_strides(wl.rank, w_ext.data(), ws_raw);
  Kokkos::Array<std::int64_t, max_dims> hx{}, gsd{}, role{}, xvalid{};
  for (int d = 0; d < rank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    hx[d] = hext[du];
    gsd[d] = gs_raw[d];
    role[d] = d == dc ? -2 : -1;
    xvalid[d] = block_of(xl.dims[d], sv.x_shape[du], mesh.sizes, mesh.coords).valid;
  }
  Kokkos::Array<std::int64_t, 3> stride{}, dil{}, pad{}, start{}, n{}, kext{}, wks{}, ooff{},
      oval{}, gss{};
  std::int64_t k_total = 1;
  for (int s = 0; s < ns; ++s) {
    const ConvWindow& win = sv.wins[static_cast<std::size_t>(s)];
    role[win.dim] = s;
    stride[s] = win.stride;
    dil[s] = win.dilation;
    pad[s] = win.pad;
    start[s] = sv.halo.start[static_cast<std::size_t>(s)];
    n[s] = win.n;
    kext[s] = win.k;
    wks[s] = ws_raw[wl.find(spec.kernel[static_cast<std::size_t>(s)])];
    const Block ob = block_of(sv.rules.output.dims[win.dim], win.n_out, mesh.sizes, mesh.coords);
    ooff[s] = ob.offset;
    oval[s] = ob.valid;
    gss[s] = gs_raw[win.dim];
    k_total *= win.k;
  }
  const std::int64_t o_valid =
      block_of(sv.rules.output.dims[dc], sv.out_shape[dcu], mesh.sizes, mesh.coords).valid;
  const std::int64_t g_o = gs_raw[dc];
  const std::int64_t ws_o = ws_raw[wl.find(spec.out_channel)];
  const std::int64_t ws_c = ws_raw[wl.find(spec.in_channel)];
  const T* gp = g.data.data();
  const T* wp = sv.w.data();
  Kokkos::View<T*> dxh(
      Kokkos::view_alloc(std::string("gshard::conv_grad_x"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(product(hext)));
  T* dp = dxh.data();
  Kokkos::parallel_for(
      "gshard::conv_grad_x", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(dxh.extent(0))),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t rest = e, gbase = 0, wbase = 0;
        Kokkos::Array<std::int64_t, 3> pos{};
        bool padding = false;
        for (int d = rank - 1; d >= 0; --d) {
          const std::int64_t i = rest % hx[d];
          rest /= hx[d];
          if (role[d] == -1) {
            if (i >= xvalid[d]) padding = true;
            gbase += i * gsd[d];
          } else if (role[d] == -2) {
            if (i >= xvalid[d]) padding = true;
            wbase += i * ws_c;
          } else {
            const auto s = role[d];
            pos[s] = start[s] + i;
            if (pos[s] >= n[s]) padding = true;
          }
        }
        T acc{};
        if (!padding) {
          for (std::int64_t o = 0; o < o_valid; ++o) {
            for (std::int64_t kk = 0; kk < k_total; ++kk) {
              std::int64_t r = kk, gi = gbase + o * g_o, wi = wbase + o * ws_o;
              bool hit = true;
              for (int s = ns - 1; s >= 0 && hit; --s) {
                const std::int64_t ks = r % kext[s];
                r /= kext[s];
                const std::int64_t t = pos[s] + pad[s] - ks * dil[s];
                const std::int64_t ho = t / stride[s] - ooff[s];
                hit = t >= 0 && t % stride[s] == 0 && ho >= 0 && ho < oval[s];
                gi += ho * gss[s];
                wi += ks * wks[s];
              }
              if (hit) acc += gp[gi] * wp[wi];
            }
          }
        }
        dp[e] = acc;
      });
  unsigned partial = detail::axes_of(sv.rules.output.dims[dc]);
  for (int i = 0; i < g.layout.partial_count; ++i)
    partial |= 1u << g.layout.partial[static_cast<std::size_t>(i)];
  RuntimeTensor<T> dx(conv_with_partials(xl, partial), sv.x_shape, {}, ReduceOp::sum);
  dx.data = conv_return_halo(xl, sv.x_shape, dxh, sv.wins, mesh, axis_names);
  return dx;
}

/// The cotangent of a conv's weights: the correlation of the widened input with g, summed over
/// this rank's batch and output positions, so partial over the axes that split them (and over
/// the input's and g's pending partials); the driver finishes it where the weights need it.
template <class T>
RuntimeTensor<T> conv_weight_cotangent(const ConvSpec& spec, const ConvSaved<T>& sv,
                                       const RuntimeTensor<T>& g, const MeshState& mesh) {
  const Layout& xl = sv.rules.input;
  const Layout& wl = sv.rules.weights;
  const int rank = xl.rank;
  const int wrank = wl.rank;
  const int ns = spec.spatial_count;
  const int dc = xl.find(spec.in_channel);
  const Shape gext = local_extents(g.layout, g.shape, mesh.sizes);
  const Shape w_ext = local_extents(wl, sv.w_shape, mesh.sizes);
  std::int64_t gs_raw[max_dims]{}, xs_raw[max_dims]{};
  row_major_strides(rank, gext.data(), gs_raw);
  row_major_strides(rank, sv.halo.extents.data(), xs_raw);
  Kokkos::Array<std::int64_t, max_dims> gx{}, gsd{}, xsd{}, role{}, gvalid{}, wx{}, wrole{},
      wvalid{};
  std::int64_t g_count = 1;  // g's local elements for one output channel
  for (int d = 0; d < rank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    gx[d] = gext[du];
    gsd[d] = gs_raw[d];
    xsd[d] = xs_raw[d];
    role[d] = d == dc ? -2 : -1;
    gvalid[d] = block_of(g.layout.dims[d], g.shape[du], mesh.sizes, mesh.coords).valid;
    if (d != dc) g_count *= gext[du];
  }
  for (int d = 0; d < wrank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    const char c = wl.dims[d].label;
    wx[d] = w_ext[du];
    wvalid[d] = block_of(wl.dims[d], sv.w_shape[du], mesh.sizes, mesh.coords).valid;
    wrole[d] = c == spec.out_channel ? -3 : c == spec.in_channel ? -2 : -1;
    for (int s = 0; s < ns; ++s)
      if (c == spec.kernel[static_cast<std::size_t>(s)]) wrole[d] = s;
  }
  Kokkos::Array<std::int64_t, 3> stride{}, dil{}, pad{}, start{}, n{}, ooff{};
  for (int s = 0; s < ns; ++s) {
    const ConvWindow& win = sv.wins[static_cast<std::size_t>(s)];
    role[win.dim] = s;
    stride[s] = win.stride;
    dil[s] = win.dilation;
    pad[s] = win.pad;
    start[s] = sv.halo.start[static_cast<std::size_t>(s)];
    n[s] = win.n;
    ooff[s] = block_of(sv.rules.output.dims[win.dim], win.n_out, mesh.sizes, mesh.coords).offset;
  }
  const T* gp = g.data.data();
  const T* xp = sv.halo.data.data();
  Kokkos::View<T*> dw(
      Kokkos::view_alloc(std::string("gshard::conv_grad_w"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(product(w_ext)));
  T* dp = dw.data();
  Kokkos::parallel_for(
      "gshard::conv_grad_w", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(dw.extent(0))),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t rest = e, o = 0, c = 0;
        Kokkos::Array<std::int64_t, 3> ks{};
        bool padding = false;
        for (int d = wrank - 1; d >= 0; --d) {
          const std::int64_t i = rest % wx[d];
          rest /= wx[d];
          if (i >= wvalid[d]) padding = true;
          if (wrole[d] == -3)
            o = i;
          else if (wrole[d] == -2)
            c = i;
          else if (wrole[d] >= 0)
            ks[wrole[d]] = i;
        }
        T acc{};
        for (std::int64_t m = 0; m < g_count && !padding; ++m) {
          std::int64_t r = m, gi = o * gsd[dc], xi = c * xsd[dc];
          bool inside = true;
          for (int d = rank - 1; d >= 0 && inside; --d) {
            if (d == dc) continue;
            const std::int64_t i = r % gx[d];
            r /= gx[d];
            gi += i * gsd[d];
            if (i >= gvalid[d]) {
              inside = false;
            } else if (role[d] == -1) {
              xi += i * xsd[d];
            } else {
              const auto s = role[d];
              const std::int64_t p = (ooff[s] + i) * stride[s] - pad[s] + ks[s] * dil[s];
              inside = p >= 0 && p < n[s];
              xi += (p - start[s]) * xsd[d];
            }
          }
          if (inside) acc += gp[gi] * xp[xi];
        }
        dp[e] = acc;
      });
  unsigned partial = partial_mask(xl);
  for (int d = 0; d < rank; ++d)
    if (d != dc) partial |= detail::axes_of(xl.dims[d]);
  for (int i = 0; i < g.layout.partial_count; ++i)
    partial |= 1u << g.layout.partial[static_cast<std::size_t>(i)];
  return RuntimeTensor<T>(conv_with_partials(wl, partial), sv.w_shape, dw, ReduceOp::sum);
}

/// The cotangent of a pooling's input on the widened block: each element gathers g from the
/// windows of this rank's output block that contain it (average: g / window size; max: only
/// where it is the window's first maximum, as the forward picks), then the halo returned. Linear
/// in g, so g's pending partials stay pending.
template <class T>
RuntimeTensor<T> pool_input_cotangent(PoolKind kind, const ConvSpec& spec, const ConvSaved<T>& sv,
                                      const RuntimeTensor<T>& g, const MeshState& mesh,
                                      const std::vector<std::string>& axis_names) {
  const Layout& xl = sv.rules.input;
  const int rank = xl.rank;
  const int ns = spec.spatial_count;
  const Shape hext = sv.halo.extents;
  const Shape gext = local_extents(g.layout, g.shape, mesh.sizes);
  std::int64_t gs_raw[max_dims]{}, xs_raw[max_dims]{};
  row_major_strides(rank, gext.data(), gs_raw);
  row_major_strides(rank, hext.data(), xs_raw);
  Kokkos::Array<std::int64_t, max_dims> hx{}, gsd{}, role{}, xvalid{};
  for (int d = 0; d < rank; ++d) {
    const auto du = static_cast<std::size_t>(d);
    hx[d] = hext[du];
    gsd[d] = gs_raw[d];
    role[d] = -1;
    xvalid[d] = block_of(xl.dims[d], sv.x_shape[du], mesh.sizes, mesh.coords).valid;
  }
  Kokkos::Array<std::int64_t, 3> stride{}, start{}, n{}, kext{}, ooff{}, oval{}, gss{}, xss{};
  std::int64_t k_total = 1;
  for (int s = 0; s < ns; ++s) {
    const ConvWindow& win = sv.wins[static_cast<std::size_t>(s)];
    role[win.dim] = s;
    stride[s] = win.stride;
    start[s] = sv.halo.start[static_cast<std::size_t>(s)];
    n[s] = win.n;
    kext[s] = win.k;
    const Block ob = block_of(sv.rules.output.dims[win.dim], win.n_out, mesh.sizes, mesh.coords);
    ooff[s] = ob.offset;
    oval[s] = ob.valid;
    gss[s] = gs_raw[win.dim];
    xss[s] = xs_raw[win.dim];
    k_total *= win.k;
  }
  const bool is_max = kind == PoolKind::max;
  const T inv_count = T(1) / static_cast<T>(k_total);
  const T* gp = g.data.data();
  const T* xp = is_max ? sv.halo.data.data() : nullptr;
  Kokkos::View<T*> dxh(
      Kokkos::view_alloc(std::string("gshard::pool_grad"), Kokkos::WithoutInitializing),
      static_cast<std::size_t>(product(hext)));
  T* dp = dxh.data();
  Kokkos::parallel_for(
      "gshard::pool_grad", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(dxh.extent(0))),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t rest = e, gbase = 0;
        Kokkos::Array<std::int64_t, 3> pos{}, lo{}, cnt{};
        bool padding = false;
        for (int d = rank - 1; d >= 0; --d) {
          const std::int64_t i = rest % hx[d];
          rest /= hx[d];
          if (role[d] == -1) {
            if (i >= xvalid[d]) padding = true;
            gbase += i * gsd[d];
          } else {
            pos[role[d]] = start[role[d]] + i;
            if (pos[role[d]] >= n[role[d]]) padding = true;
          }
        }
        T acc{};
        std::int64_t windows = padding ? 0 : 1;
        for (int s = 0; s < ns && windows > 0; ++s) {
          // Output positions (local to this rank's block) whose window holds pos[s].
          const std::int64_t t = pos[s] - kext[s] + 1;
          std::int64_t first = t <= 0 ? 0 : (t + stride[s] - 1) / stride[s];
          std::int64_t last = pos[s] / stride[s];
          first = first > ooff[s] ? first : ooff[s];
          last = last < ooff[s] + oval[s] - 1 ? last : ooff[s] + oval[s] - 1;
          lo[s] = first;
          cnt[s] = last >= first ? last - first + 1 : 0;
          windows *= cnt[s];
        }
        for (std::int64_t m = 0; m < windows; ++m) {
          std::int64_t r = m, gi = gbase;
          Kokkos::Array<std::int64_t, 3> ho{};
          for (int s = ns - 1; s >= 0; --s) {
            ho[s] = lo[s] + r % cnt[s];
            r /= cnt[s];
            gi += (ho[s] - ooff[s]) * gss[s];
          }
          if (!is_max) {
            acc += gp[gi] * inv_count;
            continue;
          }
          // The window's first maximum, scanned in the forward's order.
          std::int64_t best_at = -1, wbase = e;
          for (int s = 0; s < ns; ++s) wbase -= (pos[s] - ho[s] * stride[s]) * xss[s];
          T best{};
          for (std::int64_t kk = 0; kk < k_total; ++kk) {
            std::int64_t q = kk, at = wbase;
            for (int s = ns - 1; s >= 0; --s) {
              at += (q % kext[s]) * xss[s];
              q /= kext[s];
            }
            if (kk == 0 || xp[at] > best) {
              best = xp[at];
              best_at = at;
            }
          }
          if (best_at == e) acc += gp[gi];
        }
        dp[e] = acc;
      });
  unsigned partial = 0;
  for (int i = 0; i < g.layout.partial_count; ++i)
    partial |= 1u << g.layout.partial[static_cast<std::size_t>(i)];
  RuntimeTensor<T> dx(conv_with_partials(xl, partial), sv.x_shape, {}, ReduceOp::sum);
  dx.data = conv_return_halo(xl, sv.x_shape, dxh, sv.wins, mesh, axis_names);
  return dx;
}

}  // namespace detail
}  // namespace gshard
