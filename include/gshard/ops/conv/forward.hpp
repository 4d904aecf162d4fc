#pragma once
// The forward passes of conv and pooling on run-time layouts: operands to the rule's layouts,
// the halo exchange (spmd/halo.hpp), one Kokkos kernel over the output block.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "../../expr/node.hpp"
#include "../../spmd/halo.hpp"
#include "../../spmd/reshard.hpp"
#include "../../tensor/sharded.hpp"
#include "rules.hpp"

namespace gshard {
namespace detail {

inline std::string conv_operand_text(const char* what, const Layout& l, const Shape& shape,
                                     const std::vector<std::string>& names) {
  std::string s = what;
  s += ' ';
  s += quoted_layout(l, names);
  s += " (global shape ";
  s += shape_string(shape);
  s += ')';
  return s;
}

/// Output size of one window, or an Error naming the op, the label and the input.
inline ConvWindow conv_make_window(const std::string& op, const std::string& input_text, char label,
                                   int dim, std::int64_t n, std::int64_t k, std::int64_t stride,
                                   std::int64_t dilation, Padding padding) {
  ConvWindow w{dim, n, k, stride, dilation, 0, 0};
  const std::string at = std::string("label '") + label + "' of the " + input_text;
  if (k < 1 || stride < 1 || dilation < 1)
    throw Error(op, at + ": window " + std::to_string(k) + ", stride " + std::to_string(stride) +
                        " and dilation " + std::to_string(dilation) + " must be at least 1");
  const std::int64_t span = dilation * (k - 1) + 1;
  if (padding == Padding::same) {
    if (stride != 1)
      throw Error(op, at + ": padding \"same\" needs stride 1, got " + std::to_string(stride));
    w.pad = (span - 1) / 2;
    w.n_out = n;
  } else {
    if (n < span)
      throw Error(op, at + ": size " + std::to_string(n) + " is smaller than the window's span " +
                          std::to_string(span) + " (padding \"valid\")");
    w.n_out = (n - span) / stride + 1;
  }
  return w;
}

/// The output's global shape (input order, windows resized) and its local block's geometry.
struct ConvOutBlock {
  Shape shape, extents;
  Kokkos::Array<std::int64_t, max_dims> ext{}, off{}, valid{};
};

inline ConvOutBlock conv_out_block(const Layout& out, Shape shape,
                                   const std::vector<ConvWindow>& wins, const MeshState& mesh) {
  ConvOutBlock b;
  for (const ConvWindow& w : wins) shape[static_cast<std::size_t>(w.dim)] = w.n_out;
  b.shape = shape;
  b.extents = local_extents(out, shape, mesh.sizes);
  for (int d = 0; d < out.rank; ++d) {
    const Block blk =
        block_of(out.dims[d], shape[static_cast<std::size_t>(d)], mesh.sizes, mesh.coords);
    b.ext[d] = b.extents[static_cast<std::size_t>(d)];
    b.off[d] = blk.offset;
    b.valid[d] = blk.valid;
  }
  return b;
}

/// What the forward pass of a conv or pooling keeps for its backward pass: the layouts it ran
/// in, the global shapes (in those layouts), the windows, the widened input (its data only when
/// a backward needs the input's values) and the weights in their rule layout (only when the
/// input's cotangent is needed).
template <class T>
struct ConvSaved {
  ConvLayouts rules{};
  Shape x_shape, w_shape, out_shape;
  std::vector<ConvWindow> wins;
  ConvHalo<T> halo;
  Kokkos::View<T*> w;
};

/// The sharded convolution on run-time layouts (the typed conv1d/conv2d and the property tests
/// run this): weights to the rule layout, halo exchange, one kernel over the output block.
/// `saved`, when given, receives what the backward pass needs.
template <class T>
RuntimeTensor<T> conv_runtime(const std::string& op, const ConvSpec& spec, const ConvOptions& opt,
                              const MeshState& mesh, const std::vector<std::string>& axis_names,
                              const RuntimeTensor<T>& x, const RuntimeTensor<T>& w,
                              ConvSaved<T>* saved = nullptr) {
  const std::string xt = conv_operand_text("input", x.layout, x.shape, axis_names);
  const std::string wt = conv_operand_text("weights", w.layout, w.shape, axis_names);
  auto missing = [&](char c, const char* where) {
    throw Error(op, std::string("label '") + c + "' is not a label of the " + where + " (" + xt +
                        ", " + wt + ")");
  };
  for (int s = 0; s < spec.spatial_count; ++s) {
    if (x.layout.find(spec.spatial[static_cast<std::size_t>(s)]) < 0)
      missing(spec.spatial[static_cast<std::size_t>(s)], "input");
    if (w.layout.find(spec.kernel[static_cast<std::size_t>(s)]) < 0)
      missing(spec.kernel[static_cast<std::size_t>(s)], "weights");
  }
  if (x.layout.find(spec.in_channel) < 0) missing(spec.in_channel, "input");
  if (w.layout.find(spec.in_channel) < 0) missing(spec.in_channel, "weights");
  if (w.layout.find(spec.out_channel) < 0) missing(spec.out_channel, "weights");
  if (x.layout.find(spec.out_channel) >= 0 || w.layout.rank != spec.spatial_count + 2)
    throw Error(op,
                "the weights must hold exactly the output channel, the input channel and the "
                "kernel labels, and the output channel must be new to the input (" +
                    xt + ", " + wt + ")");
  const auto xc = static_cast<std::size_t>(x.layout.find(spec.in_channel));
  const auto wc = static_cast<std::size_t>(w.layout.find(spec.in_channel));
  if (x.shape[xc] != w.shape[wc])
    throw Error(op, std::string("input channel '") + spec.in_channel + "' has size " +
                        std::to_string(x.shape[xc]) + " in the " + xt + " but " +
                        std::to_string(w.shape[wc]) + " in the " + wt);
  if (x.layout.partial_count > 0 && x.partial_op != ReduceOp::sum)
    throw Error(op, "the input holds pending max/min partials; finish them with reshard first");
  std::vector<ConvWindow> wins;
  for (int s = 0; s < spec.spatial_count; ++s) {
    const auto si = static_cast<std::size_t>(s);
    const int d = x.layout.find(spec.spatial[si]);
    wins.push_back(
        conv_make_window(op, xt, spec.spatial[si], d, x.shape[static_cast<std::size_t>(d)],
                         w.shape[static_cast<std::size_t>(w.layout.find(spec.kernel[si]))],
                         opt.stride[si], opt.dilation[si], opt.padding));
  }
  const ConvLayouts rules = infer_conv(spec, x.layout, w.layout);
  const RuntimeTensor<T> xi =
      reshard_runtime(x, rules.input, mesh, axis_names);  // local slice at most
  // The weights' pending partials (sum, max or min) are finished on the way.
  RuntimeTensor<T> wi = reshard_runtime(w, rules.weights, mesh, axis_names);
  wi.partial_op = ReduceOp::sum;
  const ConvHalo<T> h = conv_exchange_halo(xi.layout, xi.shape, xi.data, wins, mesh, axis_names);
  RuntimeTensor<T> out{rules.output, {}, {}, ReduceOp::sum};
  Shape out_shape = xi.shape;
  out_shape[xc] = w.shape[static_cast<std::size_t>(w.layout.find(spec.out_channel))];
  const ConvOutBlock ob = conv_out_block(rules.output, out_shape, wins, mesh);
  out.shape = ob.shape;
  const auto oext = ob.ext, ooff = ob.off, oval = ob.valid;
  const auto n_out = static_cast<std::size_t>(product(ob.extents));
  out.data = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::conv"), Kokkos::WithoutInitializing), n_out);
  if (saved) *saved = ConvSaved<T>{rules, xi.shape, wi.shape, ob.shape, wins, h, wi.data};
  // Kernel geometry in plain arrays (captured by value).
  const int rank = xi.layout.rank;
  const int ns = spec.spatial_count;
  const int dc = static_cast<int>(xc);
  std::int64_t xs_raw[max_dims]{}, ws_raw[max_dims]{};
  row_major_strides(rank, h.extents.data(), xs_raw);
  const Shape w_ext = local_extents(wi.layout, wi.shape, mesh.sizes);
  row_major_strides(wi.layout.rank, w_ext.data(), ws_raw);
  Kokkos::Array<std::int64_t, max_dims> xs{}, role{};  // role: -1 batch, -2 channel, s window
  for (int d = 0; d < rank; ++d) {
    xs[d] = xs_raw[d];
    role[d] = d == dc ? -2 : -1;
  }
  Kokkos::Array<std::int64_t, 3> stride{}, dil{}, pad{}, start{}, n{}, kext{}, wks{};
  for (int s = 0; s < ns; ++s) {
    const ConvWindow& win = wins[static_cast<std::size_t>(s)];
    role[win.dim] = s;
    stride[s] = win.stride;
    dil[s] = win.dilation;
    pad[s] = win.pad;
    start[s] = h.start[static_cast<std::size_t>(s)];
    n[s] = win.n;
    kext[s] = win.k;
    wks[s] = ws_raw[wi.layout.find(spec.kernel[static_cast<std::size_t>(s)])];
  }
  const std::int64_t ws_o = ws_raw[wi.layout.find(spec.out_channel)];
  const std::int64_t ws_c = ws_raw[wi.layout.find(spec.in_channel)];
  const std::int64_t c_local = h.extents[xc];
  std::int64_t k_total = 1;
  for (int s = 0; s < ns; ++s) k_total *= kext[s];
  const T* xp = h.data.data();
  const T* wp = wi.data.data();
  T* op_ = out.data.data();
  Kokkos::parallel_for(
      "gshard::conv", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(n_out)),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t rest = e, xbase = 0, wbase = 0;
        Kokkos::Array<std::int64_t, 3> pos{}, xss{};
        bool pad_out = false;
        for (int d = rank - 1; d >= 0; --d) {
          const std::int64_t i = rest % oext[d];
          rest /= oext[d];
          if (i >= oval[d]) pad_out = true;
          if (role[d] == -1) {
            xbase += i * xs[d];
          } else if (role[d] == -2) {
            wbase += i * ws_o;
          } else {
            const auto s = role[d];
            pos[s] = (ooff[d] + i) * stride[s] - pad[s];
            xss[s] = xs[d];
          }
        }
        T acc{};
        if (!pad_out) {
          for (std::int64_t c = 0; c < c_local; ++c) {
            for (std::int64_t kk = 0; kk < k_total; ++kk) {
              std::int64_t r = kk, xi_ = xbase + c * xs[dc], wi_ = wbase + c * ws_c;
              bool inside = true;
              for (int s = ns - 1; s >= 0; --s) {
                const std::int64_t ks = r % kext[s];
                r /= kext[s];
                const std::int64_t g = pos[s] + ks * dil[s];
                if (g < 0 || g >= n[s]) inside = false;
                xi_ += (g - start[s]) * xss[s];
                wi_ += ks * wks[s];
              }
              if (inside) acc += xp[xi_] * wp[wi_];
            }
          }
        }
        op_[e] = acc;
      });
  return out;
}

enum class PoolKind { max, avg };

/// Pooling on run-time layouts: max pooling of a partial input finishes the sum first.
template <class T>
RuntimeTensor<T> pool_runtime(const std::string& op, PoolKind kind, const ConvSpec& spec,
                              const PoolOptions& opt, const MeshState& mesh,
                              const std::vector<std::string>& axis_names, const RuntimeTensor<T>& x,
                              ConvSaved<T>* saved = nullptr) {
  const std::string xt = conv_operand_text("input", x.layout, x.shape, axis_names);
  for (int s = 0; s < spec.spatial_count; ++s)
    if (x.layout.find(spec.spatial[static_cast<std::size_t>(s)]) < 0)
      throw Error(op, std::string("label '") + spec.spatial[static_cast<std::size_t>(s)] +
                          "' is not a label of the " + xt);
  if (x.layout.partial_count > 0 && x.partial_op != ReduceOp::sum)
    throw Error(op, "the input holds pending max/min partials; finish them with reshard first");
  std::vector<ConvWindow> wins;
  for (int s = 0; s < spec.spatial_count; ++s) {
    const auto si = static_cast<std::size_t>(s);
    const int d = x.layout.find(spec.spatial[si]);
    wins.push_back(conv_make_window(
        op, xt, spec.spatial[si], d, x.shape[static_cast<std::size_t>(d)], opt.window[si],
        opt.stride[si] == 0 ? opt.window[si] : opt.stride[si], 1, Padding::valid));
  }
  const RuntimeTensor<T> xi =
      reshard_runtime(x, infer_pool(x.layout, kind == PoolKind::max), mesh, axis_names);
  const ConvHalo<T> h = conv_exchange_halo(xi.layout, xi.shape, xi.data, wins, mesh, axis_names);
  RuntimeTensor<T> out{xi.layout, {}, {}, ReduceOp::sum};
  const ConvOutBlock ob = conv_out_block(xi.layout, xi.shape, wins, mesh);
  out.shape = ob.shape;
  const auto oext = ob.ext, ooff = ob.off, oval = ob.valid;
  const auto n_out = static_cast<std::size_t>(product(ob.extents));
  out.data = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::pool"), Kokkos::WithoutInitializing), n_out);
  if (saved)
    *saved = ConvSaved<T>{{xi.layout, Layout{}, xi.layout}, xi.shape, {}, ob.shape, wins, h, {}};
  const int rank = xi.layout.rank;
  const int ns = spec.spatial_count;
  std::int64_t xs_raw[max_dims]{};
  row_major_strides(rank, h.extents.data(), xs_raw);
  Kokkos::Array<std::int64_t, max_dims> xs{}, role{};
  for (int d = 0; d < rank; ++d) {
    xs[d] = xs_raw[d];
    role[d] = -1;
  }
  Kokkos::Array<std::int64_t, 3> stride{}, start{}, kext{};
  std::int64_t k_total = 1;
  for (int s = 0; s < ns; ++s) {
    const ConvWindow& win = wins[static_cast<std::size_t>(s)];
    role[win.dim] = s;
    stride[s] = win.stride;
    start[s] = h.start[static_cast<std::size_t>(s)];
    kext[s] = win.k;
    k_total *= win.k;
  }
  const bool is_max = kind == PoolKind::max;
  const T count = static_cast<T>(k_total);
  const T* xp = h.data.data();
  T* op_ = out.data.data();
  Kokkos::parallel_for(
      "gshard::pool", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(n_out)),
      KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t rest = e, base = 0;
        Kokkos::Array<std::int64_t, 3> xss{};
        bool pad_out = false;
        for (int d = rank - 1; d >= 0; --d) {
          const std::int64_t i = rest % oext[d];
          rest /= oext[d];
          if (i >= oval[d]) pad_out = true;
          if (role[d] == -1) {
            base += i * xs[d];
          } else {
            const auto s = role[d];
            base += ((ooff[d] + i) * stride[s] - start[s]) * xs[d];
            xss[s] = xs[d];
          }
        }
        T acc{};
        if (!pad_out) {
          // Windows lie inside [0, n) (no padding): every element read is real data.
          for (std::int64_t kk = 0; kk < k_total; ++kk) {
            std::int64_t r = kk, at = base;
            for (int s = ns - 1; s >= 0; --s) {
              at += (r % kext[s]) * xss[s];
              r /= kext[s];
            }
            const T v = xp[at];
            acc = kk == 0 ? v : is_max ? (v > acc ? v : acc) : acc + v;
          }
          if (!is_max) acc /= count;
        }
        op_[e] = acc;
      });
  return out;
}

}  // namespace detail
}  // namespace gshard
