#pragma once
// Windowed ops: conv1d/conv2d (cross-correlation, as PyTorch's conv) and max/avg pooling, whose
// spatial labels may be split over mesh axes. Each rank first fetches the input rows its output
// windows need from the ranks along that label's axes (a halo exchange by send_recv, several
// hops when the halo is wider than a shard), one spatial label after another (so corners arrive
// in two steps), then runs one local Kokkos kernel over its output block.
#include <array>
#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../comm/collectives.hpp"
#include "../expr/node.hpp"
#include "../kernels/copy_box.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

/// valid: no padding, out = floor((N - dilation*(K-1) - 1) / stride) + 1.
/// same: zeros around the input so that out = N (stride 1 only); dilation*(K-1) zeros in all,
/// the smaller half before (PyTorch's padding="same").
enum class Padding { valid, same };

/// Per spatial label, in the spec's order.
struct ConvOptions {
  Padding padding = Padding::valid;
  std::array<int, 3> stride{1, 1, 1};
  std::array<int, 3> dilation{1, 1, 1};
};

/// Pooling windows per spatial label (no padding); stride 0 means the window.
struct PoolOptions {
  std::array<int, 3> window{1, 1, 1};
  std::array<int, 3> stride{0, 0, 0};
};

namespace conv_error {
template <class>
inline constexpr bool always_false = false;
template <auto Piece, auto Spec>
struct malformed_conv_spec {
  static_assert(always_false<malformed_conv_spec>,
                "gshard::conv: write \"H:K W:L C->O\" (input spatial label:kernel label, then "
                "input channel->output channel) or, for pooling, \"HW\"");
};
template <auto Label, auto Spec>
struct label_repeated_in_conv_spec {
  static_assert(always_false<label_repeated_in_conv_spec>,
                "gshard::conv: a label appears twice in the spec");
};
template <auto Label, auto InputSpec>
struct label_not_in_input {
  static_assert(always_false<label_not_in_input>,
                "gshard::conv/pool: a spatial or input-channel label is not a label of the input");
};
template <auto Label, auto InputSpec>
struct output_channel_label_in_input {
  static_assert(always_false<output_channel_label_in_input>,
                "gshard::conv: the output channel label must be new to the input");
};
template <auto Conv, auto WeightSpec>
struct weight_labels_differ_from_conv_spec {
  static_assert(always_false<weight_labels_differ_from_conv_spec>,
                "gshard::conv: the weights' labels must be the output channel, the input channel "
                "and one kernel label per spatial label, in any order");
};
template <auto Spec, int Expected>
struct wrong_spatial_label_count {
  static_assert(always_false<wrong_spatial_label_count>,
                "gshard::conv1d needs one \"X:K\" pair, conv2d two");
};
}  // namespace conv_error

/// A parsed conv or pooling spec. Pooling specs have no channels (in_channel == 0).
struct ConvSpec {
  int spatial_count = 0;
  std::array<char, 3> spatial{};  // input labels that slide
  std::array<char, 3> kernel{};   // the weights' matching kernel labels
  char in_channel = 0;            // contracted
  char out_channel = 0;           // the weights' label that replaces in_channel in the output
};

enum class ConvSpecError { none, malformed, label_repeated };

struct ConvParse {
  ConvSpec spec{};
  ConvSpecError error = ConvSpecError::none;
  std::string_view offending{};
};

namespace detail {

constexpr bool conv_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

constexpr ConvParse conv_repeats(ConvParse p, std::string_view text) {
  std::array<char, 8> seen{};
  int n = 0;
  auto add = [&](char c) {
    for (int i = 0; i < n; ++i)
      if (seen[static_cast<std::size_t>(i)] == c) return false;
    seen[static_cast<std::size_t>(n++)] = c;
    return true;
  };
  for (int i = 0; i < p.spec.spatial_count; ++i) {
    const auto s = static_cast<std::size_t>(i);
    for (char c : {p.spec.spatial[s], p.spec.kernel[s]})
      if (c != 0 && !add(c)) {
        p.error = ConvSpecError::label_repeated;
        p.offending = text.substr(text.find(c), 1);
        return p;
      }
  }
  for (char c : {p.spec.in_channel, p.spec.out_channel})
    if (c != 0 && !add(c)) {
      p.error = ConvSpecError::label_repeated;
      p.offending = text.substr(text.find(c), 1);
      return p;
    }
  return p;
}

/// "H:K W:L C->O": 1 to 3 pairs (input spatial label : weights' kernel label), then the input
/// channel and the output channel.
constexpr ConvParse parse_conv(std::string_view text) {
  ConvParse p;
  std::size_t i = 0;
  auto fail = [&](std::string_view piece) {
    p.error = ConvSpecError::malformed;
    p.offending = piece.empty() ? text : piece;
    return p;
  };
  for (;;) {
    while (i < text.size() && text[i] == ' ') ++i;
    std::size_t e = i;
    while (e < text.size() && text[e] != ' ') ++e;
    const std::string_view tok = text.substr(i, e - i);
    if (tok.empty()) return fail(text);
    i = e;
    if (tok.size() == 3 && tok[1] == ':' && conv_letter(tok[0]) && conv_letter(tok[2])) {
      if (p.spec.spatial_count == 3) return fail(tok);
      const auto s = static_cast<std::size_t>(p.spec.spatial_count++);
      p.spec.spatial[s] = tok[0];
      p.spec.kernel[s] = tok[2];
      continue;
    }
    if (tok.size() == 4 && tok[1] == '-' && tok[2] == '>' && conv_letter(tok[0]) &&
        conv_letter(tok[3]) && p.spec.spatial_count > 0) {
      while (i < text.size() && text[i] == ' ') ++i;
      if (i != text.size()) return fail(text.substr(i));
      p.spec.in_channel = tok[0];
      p.spec.out_channel = tok[3];
      return conv_repeats(p, text);
    }
    return fail(tok);
  }
}

/// "HW": the spatial labels of a pooling, 1 to 3.
constexpr ConvParse parse_pool(std::string_view text) {
  ConvParse p;
  if (text.empty() || text.size() > 3) {
    p.error = ConvSpecError::malformed;
    p.offending = text;
    return p;
  }
  for (char c : text) {
    if (!conv_letter(c)) {
      p.error = ConvSpecError::malformed;
      p.offending = text;
      return p;
    }
    p.spec.spatial[static_cast<std::size_t>(p.spec.spatial_count++)] = c;
  }
  return conv_repeats(p, text);
}

}  // namespace detail

/// The layouts a convolution brings its operands to, and its result's layout.
struct ConvLayouts {
  Layout input;
  Layout weights;
  Layout output;
};

/// The partition rule (labels assumed checked):
/// 1. The input keeps its layout: spatial and other (batch) labels keep their axes, and so do
///    its pending partial sums (convolution is linear in the input).
/// 2. The input channel C takes the input's axes; when the input does not split C, the
///    weights' axes for C if the input uses none of them (the input is sliced locally).
///    The result is a partial sum over C's axes.
/// 3. The output channel O (at C's position in the input's label order) takes the weights'
///    axes for O when the input uses none of them (nor C), else it is replicated.
/// 4. The weights are brought to: O and C as above, kernel labels whole, no pending sums.
constexpr ConvLayouts infer_conv(const ConvSpec& s, const Layout& x, const Layout& w) {
  ConvLayouts r{x, w, x};
  const int xc = x.find(s.in_channel);
  const int wc = w.find(s.in_channel);
  const int wo = w.find(s.out_channel);
  unsigned used = detail::partial_mask(x);
  for (int d = 0; d < x.rank; ++d)
    if (d != xc) used |= detail::axes_of(x.dims[d]);
  DimLayout c = x.dims[xc];
  if (!c.split() && (detail::axes_of(w.dims[wc]) & used) == 0) {
    c.axis_count = w.dims[wc].axis_count;
    c.axes = w.dims[wc].axes;
  }
  r.input.dims[xc] = c;
  used |= detail::axes_of(c);
  DimLayout o{s.out_channel, 0, {}};
  if ((detail::axes_of(w.dims[wo]) & used) == 0) {
    o.axis_count = w.dims[wo].axis_count;
    o.axes = w.dims[wo].axes;
  }
  r.weights.partial_count = 0;
  for (int d = 0; d < w.rank; ++d) {
    const char l = w.dims[d].label;
    r.weights.dims[d] = l == s.in_channel    ? DimLayout{l, c.axis_count, c.axes}
                        : l == s.out_channel ? o
                                             : DimLayout{l, 0, {}};
  }
  r.output.dims[xc] = o;
  for (int i = 0; i < c.axis_count; ++i)
    r.output.partial[static_cast<std::size_t>(r.output.partial_count++)] =
        c.axes[static_cast<std::size_t>(i)];
  return r;
}

/// Pooling keeps the input's layout; max pooling finishes pending partial sums first (it is not
/// linear), average pooling keeps them pending.
constexpr Layout infer_pool(const Layout& x, bool is_max) {
  Layout r = x;
  if (is_max) r.partial_count = 0;
  return r;
}

namespace detail {

/// One sliding dimension: input size n, window k, stride, dilation, zeros before (pad), output
/// size n_out; `dim` is its position in the input's layout.
struct ConvWindow {
  int dim = 0;
  std::int64_t n = 0, k = 1, stride = 1, dilation = 1, pad = 0, n_out = 0;
};

struct ConvRange {
  std::int64_t lo = 0, hi = 0;
  [[nodiscard]] std::int64_t size() const { return hi > lo ? hi - lo : 0; }
};

inline ConvRange conv_intersect(ConvRange a, ConvRange b) {
  return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)};
}

/// The input rows (clipped to [0, n)) that output block `i` of `shards` needs.
inline ConvRange conv_window_need(const ConvWindow& w, int i, int shards) {
  const std::int64_t co = ceil_div(w.n_out, shards);
  const std::int64_t o0 = co * i;
  const std::int64_t o1 = std::min(w.n_out, o0 + co);
  if (o1 <= o0) return {};
  const ConvRange r{std::max<std::int64_t>(0, o0 * w.stride - w.pad),
                    std::min(w.n, (o1 - 1) * w.stride - w.pad + w.dilation * (w.k - 1) + 1)};
  return r.size() > 0 ? r : ConvRange{};
}

inline ConvRange conv_window_held(const ConvWindow& w, int i, int shards) {
  const std::int64_t c = ceil_div(w.n, shards);
  return {c * i, std::min(w.n, c * (i + 1))};
}

/// The rank in mesh.groups[mask of d's axes] of block `index` of dimension d (the group is
/// row-major over the axes in mesh order; the block index is row-major in d's axis order).
inline int conv_block_group_rank(const DimLayout& d, int index,
                                 const std::array<int, max_axes>& sizes) {
  std::array<int, max_axes> c{};
  for (int i = d.axis_count - 1; i >= 0; --i) {
    const auto a = static_cast<std::size_t>(d.axes[static_cast<std::size_t>(i)]);
    c[a] = index % sizes[a];
    index /= sizes[a];
  }
  int r = 0;
  for (std::size_t a = 0; a < max_axes; ++a)
    if (d.uses(static_cast<int>(a))) r = r * sizes[a] + c[a];
  return r;
}

/// The hops at which some block needs rows another block holds (data flows from block j to
/// block j + hop); the same on every rank, decided from shapes.
inline std::vector<int> conv_hops(const ConvWindow& w, int k) {
  std::vector<int> hops;
  for (int hop = -(k - 1); hop <= k - 1; ++hop) {
    bool any = false;
    for (int i = 0; i < k && !any && hop != 0; ++i)
      if (i - hop >= 0 && i - hop < k)
        any = conv_intersect(conv_window_need(w, i, k), conv_window_held(w, i - hop, k)).size() > 0;
    if (any) hops.push_back(hop);
  }
  return hops;
}

/// This rank's input widened to every row its output windows need: `start` is the global index
/// of local row 0 in each window's dimension; other dimensions are the padded local block.
template <class T>
struct ConvHalo {
  Kokkos::View<T*> data;
  Shape extents;
  std::vector<std::int64_t> start;  // per window
};

/// The halo exchange: per window, in order, hop by hop along the window label's axes, each rank
/// sends every neighbour the rows of its block that the neighbour's windows need (only valid
/// data: padding stays home), so only halo bytes move. Every rank of the mesh makes the same
/// calls (hops are decided from shapes), with MPI_PROC_NULL where nothing goes.
template <class T>
ConvHalo<T> conv_exchange_halo(const Layout& l, const Shape& shape, const Kokkos::View<T*>& local,
                               const std::vector<ConvWindow>& wins, const MeshState& mesh,
                               const std::vector<std::string>& axis_names) {
  ConvHalo<T> h{local, local_extents(l, shape, mesh.sizes), {}};
  Shape valid(static_cast<std::size_t>(l.rank));
  for (int d = 0; d < l.rank; ++d)
    valid[static_cast<std::size_t>(d)] =
        block_of(l.dims[d], shape[static_cast<std::size_t>(d)], mesh.sizes, mesh.coords).valid;
  for (const ConvWindow& w : wins) {
    const auto wd = static_cast<std::size_t>(w.dim);
    const DimLayout& dim = l.dims[w.dim];
    const int k = shard_count(dim, mesh.sizes);
    const int me = shard_index(dim, mesh.sizes, mesh.coords);
    const ConvRange held = conv_window_held(w, me, k);
    const ConvRange need = conv_window_need(w, me, k);
    const std::vector<int> hops = conv_hops(w, k);
    // Nothing to fetch and the block is exactly the rows needed (a whole label, "same"
    // padding): use it in place. Hops are the same on every rank, so no rank waits on us.
    if (hops.empty() && need.lo == held.lo && need.size() == h.extents[wd]) {
      h.start.push_back(need.lo);
      continue;
    }
    Shape ext = h.extents;
    ext[wd] = need.size();
    Kokkos::View<T*> out("gshard::conv halo", static_cast<std::size_t>(product(ext)));
    std::int64_t src_stride[max_dims]{}, dst_stride[max_dims]{};
    row_major_strides(l.rank, h.extents.data(), src_stride);
    row_major_strides(l.rank, ext.data(), dst_stride);
    // A slab: rows [r.lo, r.hi) of dimension wd, the valid part of the others.
    auto slab = [&](ConvRange r) {
      BoxCopy b;
      b.rank = l.rank;
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d)
        b.box[d] = d == wd ? r.size() : valid[d];
      return b;
    };
    auto with_strides = [&](BoxCopy b, const std::int64_t* ss, std::int64_t s0,
                            const std::int64_t* ts, std::int64_t t0) {
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d) {
        b.src_stride[d] = ss[d];
        b.dst_stride[d] = ts[d];
      }
      b.src_start[wd] = s0;
      b.dst_start[wd] = t0;
      return b;
    };
    const ConvRange own = conv_intersect(held, need);
    if (own.size() > 0)
      copy_box(h.data.data(), out.data(),
               with_strides(slab(own), src_stride, own.lo - held.lo, dst_stride, own.lo - need.lo));
    const auto mask = static_cast<std::size_t>(axes_of(dim));
    const std::string axes = axes_string(static_cast<unsigned>(mask), axis_names);
    for (const int hop : hops) {
      const ConvRange send_rows = me + hop >= 0 && me + hop < k
                                      ? conv_intersect(conv_window_need(w, me + hop, k), held)
                                      : ConvRange{};
      const ConvRange recv_rows = me - hop >= 0 && me - hop < k
                                      ? conv_intersect(need, conv_window_held(w, me - hop, k))
                                      : ConvRange{};
      const BoxCopy sb = slab(send_rows);
      const BoxCopy rb = slab(recv_rows);
      Kokkos::View<T*> send("gshard::conv halo send", static_cast<std::size_t>(sb.volume()));
      Kokkos::View<T*> recv("gshard::conv halo recv", static_cast<std::size_t>(rb.volume()));
      std::int64_t packed[max_dims]{};
      row_major_strides(l.rank, sb.box, packed);
      if (sb.volume() > 0)
        copy_box(h.data.data(), send.data(),
                 with_strides(sb, src_stride, send_rows.lo - held.lo, packed, 0));
      {
        MpiAccess<T> s(send, true);
        MpiAccess<T> r(recv, false);
        send_recv(
            s.data(), sb.volume(),
            sb.volume() > 0 ? conv_block_group_rank(dim, me + hop, mesh.sizes) : MPI_PROC_NULL,
            r.data(), rb.volume(),
            rb.volume() > 0 ? conv_block_group_rank(dim, me - hop, mesh.sizes) : MPI_PROC_NULL,
            mesh.groups[mask], axes);
        r.copy_out();
      }
      row_major_strides(l.rank, rb.box, packed);
      if (rb.volume() > 0)
        copy_box(recv.data(), out.data(),
                 with_strides(rb, packed, 0, dst_stride, recv_rows.lo - need.lo));
    }
    h.data = out;
    h.extents = ext;
    valid[wd] = need.size();
    h.start.push_back(need.lo);
  }
  return h;
}

inline std::string conv_operand_text(const char* what, const Layout& l, const Shape& shape,
                                     const std::vector<std::string>& names) {
  return std::string(what) + " \"" + layout_text(l, names) + "\" (global shape " +
         shape_string(shape) + ")";
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

template <class T>
RuntimeTensor<T> conv_bring_to(const RuntimeTensor<T>& t, const Layout& need, const MeshState& mesh,
                               const std::vector<std::string>& axis_names) {
  if (t.layout == need) return t;
  const ReshardPlan plan = plan_reshard(t.layout, need, t.shape, mesh.sizes, mesh.coords,
                                        axis_names, std::int64_t{sizeof(T)});
  RuntimeTensor<T> out{need, shape_in(need, t.layout, t.shape), {}, t.partial_op};
  out.data = ReshardExecutor<T>(plan, mesh, t.partial_op).run(t.data);
  return out;
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
      conv_bring_to(x, rules.input, mesh, axis_names);  // local slice at most
  // The weights' pending partials (sum, max or min) are finished on the way.
  RuntimeTensor<T> wi = conv_bring_to(w, rules.weights, mesh, axis_names);
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
      conv_bring_to(x, infer_pool(x.layout, kind == PoolKind::max), mesh, axis_names);
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

// ---- Backward passes ----------------------------------------------------------------------

/// dst[box] += src[box], the geometry of copy_box.
template <class T>
void conv_add_box(const T* src, T* dst, const BoxCopy& b) {
  const std::int64_t n = b.volume();
  if (n == 0) return;
  Kokkos::parallel_for(
      "gshard::conv_add_box", Kokkos::RangePolicy<>(0, n), KOKKOS_LAMBDA(std::int64_t e) {
        std::int64_t rest = e, s = 0, t = 0;
        for (int d = b.rank - 1; d >= 0; --d) {
          const std::int64_t i = rest % b.box[d];
          rest /= b.box[d];
          s += (b.src_start[d] + i) * b.src_stride[d];
          t += (b.dst_start[d] + i) * b.dst_stride[d];
        }
        dst[t] += src[s];
      });
}

/// The adjoint of conv_exchange_halo: `halo` holds a cotangent over the widened block that the
/// forward built from layout `l`; every row goes back to the block that holds it and is added
/// there. Windows in reverse order, each hop's send_recv mirrored (rows a rank received at hop h
/// are returned at hop h, to the rank they came from), so exactly the halo bytes move again.
/// Returns the local block, padding zero.
template <class T>
Kokkos::View<T*> conv_return_halo(const Layout& l, const Shape& shape, Kokkos::View<T*> halo,
                                  const std::vector<ConvWindow>& wins, const MeshState& mesh,
                                  const std::vector<std::string>& axis_names) {
  struct Stage {
    std::size_t wd = 0;
    Shape ext, valid;  // the widened block's geometry before this window's exchange
    ConvRange held, need;
    std::vector<int> hops;
    int k = 1, me = 0;
    bool in_place = false;
  };
  std::vector<Stage> stages;
  Shape ext = local_extents(l, shape, mesh.sizes);
  Shape valid(static_cast<std::size_t>(l.rank));
  for (int d = 0; d < l.rank; ++d)
    valid[static_cast<std::size_t>(d)] =
        block_of(l.dims[d], shape[static_cast<std::size_t>(d)], mesh.sizes, mesh.coords).valid;
  for (const ConvWindow& w : wins) {  // replays the forward's decisions
    Stage st;
    st.wd = static_cast<std::size_t>(w.dim);
    st.k = shard_count(l.dims[w.dim], mesh.sizes);
    st.me = shard_index(l.dims[w.dim], mesh.sizes, mesh.coords);
    st.held = conv_window_held(w, st.me, st.k);
    st.need = conv_window_need(w, st.me, st.k);
    st.hops = conv_hops(w, st.k);
    st.in_place = st.hops.empty() && st.need.lo == st.held.lo && st.need.size() == ext[st.wd];
    st.ext = ext;
    st.valid = valid;
    if (!st.in_place) {
      ext[st.wd] = st.need.size();
      valid[st.wd] = st.need.size();
    }
    stages.push_back(std::move(st));
  }
  Kokkos::View<T*> cur = halo;
  Shape cur_ext = ext;
  for (std::size_t si = stages.size(); si-- > 0;) {
    const Stage& st = stages[si];
    const ConvWindow& w = wins[si];
    if (st.in_place) continue;
    const std::size_t wd = st.wd;
    Kokkos::View<T*> out("gshard::conv halo return", static_cast<std::size_t>(product(st.ext)));
    std::int64_t cur_stride[max_dims]{}, out_stride[max_dims]{};
    row_major_strides(l.rank, cur_ext.data(), cur_stride);
    row_major_strides(l.rank, st.ext.data(), out_stride);
    auto slab = [&](ConvRange r) {
      BoxCopy b;
      b.rank = l.rank;
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d)
        b.box[d] = d == wd ? r.size() : st.valid[d];
      return b;
    };
    auto with_strides = [&](BoxCopy b, const std::int64_t* ss, std::int64_t s0,
                            const std::int64_t* ts, std::int64_t t0) {
      for (std::size_t d = 0; d < static_cast<std::size_t>(l.rank); ++d) {
        b.src_stride[d] = ss[d];
        b.dst_stride[d] = ts[d];
      }
      b.src_start[wd] = s0;
      b.dst_start[wd] = t0;
      return b;
    };
    const ConvRange own = conv_intersect(st.held, st.need);
    if (own.size() > 0)
      copy_box(cur.data(), out.data(),
               with_strides(slab(own), cur_stride, own.lo - st.need.lo, out_stride,
                            own.lo - st.held.lo));
    const DimLayout& dim = l.dims[w.dim];
    const auto mask = static_cast<std::size_t>(axes_of(dim));
    const std::string axes = axes_string(static_cast<unsigned>(mask), axis_names);
    const int k = st.k, me = st.me;
    for (const int hop : st.hops) {
      // Forward: rows `back` came from block me - hop; rows `mine` went to block me + hop.
      const ConvRange back = me - hop >= 0 && me - hop < k
                                 ? conv_intersect(st.need, conv_window_held(w, me - hop, k))
                                 : ConvRange{};
      const ConvRange mine = me + hop >= 0 && me + hop < k
                                 ? conv_intersect(conv_window_need(w, me + hop, k), st.held)
                                 : ConvRange{};
      const BoxCopy sb = slab(back);
      const BoxCopy rb = slab(mine);
      Kokkos::View<T*> send("gshard::conv halo send", static_cast<std::size_t>(sb.volume()));
      Kokkos::View<T*> recv("gshard::conv halo recv", static_cast<std::size_t>(rb.volume()));
      std::int64_t packed[max_dims]{};
      row_major_strides(l.rank, sb.box, packed);
      if (sb.volume() > 0)
        copy_box(cur.data(), send.data(),
                 with_strides(sb, cur_stride, back.lo - st.need.lo, packed, 0));
      {
        MpiAccess<T> s(send, true);
        MpiAccess<T> r(recv, false);
        send_recv(
            s.data(), sb.volume(),
            sb.volume() > 0 ? conv_block_group_rank(dim, me - hop, mesh.sizes) : MPI_PROC_NULL,
            r.data(), rb.volume(),
            rb.volume() > 0 ? conv_block_group_rank(dim, me + hop, mesh.sizes) : MPI_PROC_NULL,
            mesh.groups[mask], axes);
        r.copy_out();
      }
      row_major_strides(l.rank, rb.box, packed);
      if (rb.volume() > 0)
        conv_add_box(recv.data(), out.data(),
                     with_strides(rb, packed, 0, out_stride, mine.lo - st.held.lo));
    }
    cur = out;
    cur_ext = st.ext;
  }
  return cur;
}

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

template <fixed_string Spec, bool Pool>
constexpr bool conv_spec_ok() {
  constexpr ConvParse p = Pool ? parse_pool(Spec.view()) : parse_conv(Spec.view());
  if constexpr (p.error == ConvSpecError::none) {
    return true;
  } else {
    constexpr auto what = make_fixed<p.offending.size()>(p.offending);
    if constexpr (p.error == ConvSpecError::malformed)
      return sizeof(conv_error::malformed_conv_spec<detail::shown<what>, detail::shown<Spec>>) == 0;
    else
      return sizeof(conv_error::label_repeated_in_conv_spec<detail::shown<what>,
                                                            detail::shown<Spec>>) == 0;
  }
}

template <char Label>
constexpr fixed_string conv_label_fixed() {
  fixed_string f;
  f.data[0] = Label;
  return f;
}

template <char Label, class X>
constexpr bool conv_in_input() {
  if constexpr (X::layout.find(Label) >= 0) {
    return true;
  } else {
    return sizeof(conv_error::label_not_in_input<detail::shown<conv_label_fixed<Label>()>,
                                                 detail::shown<X::spec>>) == 0;
  }
}

template <fixed_string Spec, class X, int... I>
constexpr bool conv_spatial_in_input(std::integer_sequence<int, I...>) {
  constexpr ConvSpec s = parse_conv(Spec.view()).spec;
  return (conv_in_input<s.spatial[static_cast<std::size_t>(I)], X>() && ...);
}

constexpr bool conv_weights_match(const ConvSpec& s, const Layout& w) {
  if (w.rank != s.spatial_count + 2) return false;
  if (w.find(s.in_channel) < 0 || w.find(s.out_channel) < 0) return false;
  for (int i = 0; i < s.spatial_count; ++i)
    if (w.find(s.kernel[static_cast<std::size_t>(i)]) < 0) return false;
  return true;
}

template <fixed_string Spec, class X, class W>
constexpr bool conv_operands_ok() {
  constexpr ConvSpec s = parse_conv(Spec.view()).spec;
  constexpr bool weights_match = conv_weights_match(s, W::layout);
  if constexpr (!conv_in_input<s.in_channel, X>()) {
    return false;
  } else if constexpr (!conv_spatial_in_input<Spec, X>(
                           std::make_integer_sequence<int, s.spatial_count>{})) {
    return false;
  } else if constexpr (X::layout.find(s.out_channel) >= 0) {
    return sizeof(conv_error::output_channel_label_in_input<
                  detail::shown<conv_label_fixed<s.out_channel>()>, detail::shown<X::spec>>) == 0;
  } else if constexpr (!weights_match) {
    return sizeof(conv_error::weight_labels_differ_from_conv_spec<detail::shown<Spec>,
                                                                  detail::shown<W::spec>>) == 0;
  } else {
    return true;
  }
}

template <fixed_string Spec, int Count>
constexpr bool conv_count_ok() {
  if constexpr (Count == 0 || parse_conv(Spec.view()).spec.spatial_count == Count)
    return true;
  else
    return sizeof(
               conv_error::wrong_spatial_label_count<detail::shown<Spec>, detail::shown<Count>>) ==
           0;
}

template <fixed_string Name, fixed_string Spec, int Count, class X, class W>
auto conv_typed(const X& x, const W& w, const ConvOptions& opt) {
  if constexpr (!conv_spec_ok<Spec, false>()) {
    return 0;
  } else if constexpr (!conv_count_ok<Spec, Count>() || !conv_operands_ok<Spec, X, W>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename X::value_type, typename W::value_type> &&
                      std::is_same_v<typename X::mesh_type, typename W::mesh_type>,
                  "gshard::conv: input and weights must have the same element type and Mesh type");
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    constexpr ConvSpec s = parse_conv(Spec.view()).spec;
    constexpr ConvLayouts L = infer_conv(s, X::layout, W::layout);
    // The weights' reshard (whole kernel labels, finished partial sums) is a collective.
    static_assert(strict_check<MeshT, Name, 0, X::layout, L.input>() &&
                  strict_check<MeshT, Name, 1, W::layout, L.weights>());
    const std::string op = std::string(Name.view()) + " \"" + std::string(Spec.view()) + "\"";
    const RuntimeTensor<T> xr = materialise_as(x, L.input, op);
    const RuntimeTensor<T> wr = materialise_as(w, L.weights, op);
    using R = Sharded<T, MeshT, spec_of<MeshT, L.output>()>;
    if constexpr (differentiable_v<T>) {
      const bool need_x = xr.grad != nullptr, need_w = wr.grad != nullptr;
      if (recording() && (need_x || need_w)) {
        ConvSaved<T> sv;
        RuntimeTensor<T> r =
            conv_runtime<T>(op, s, opt, x.mesh().state(), axis_name_list<MeshT>(), xr, wr, &sv);
        // Keep only what the wanted cotangents read: the weights for dx, the widened input
        // for dw.
        if (!need_x) sv.w = {};
        if (!need_w) sv.halo.data = {};
        record(x.mesh(), r, op, std::source_location{}, {xr.grad, wr.grad},
               [cs = s, sv, need_x, need_w, m = x.mesh()](const RuntimeTensor<T>& g) {
                 Cotangents c(2);
                 if (need_x)
                   c[0] = AnyTensor(
                       conv_input_cotangent<T>(cs, sv, g, m.state(), axis_name_list<MeshT>()));
                 if (need_w) c[1] = AnyTensor(conv_weight_cotangent<T>(cs, sv, g, m.state()));
                 return c;
               });
        return sharded_from<R>(x.mesh(), r);
      }
    }
    const RuntimeTensor<T> r =
        conv_runtime<T>(op, s, opt, x.mesh().state(), axis_name_list<MeshT>(), xr, wr);
    return R(x.mesh(), r.shape, r.data);
  }
}

template <fixed_string Spec, class X, int... I>
constexpr bool pool_labels_in_input(std::integer_sequence<int, I...>) {
  constexpr ConvSpec s = parse_pool(Spec.view()).spec;
  return (conv_in_input<s.spatial[static_cast<std::size_t>(I)], X>() && ...);
}

template <fixed_string Name, fixed_string Spec, PoolKind Kind, class X>
auto pool_typed(const X& x, const PoolOptions& opt) {
  if constexpr (!conv_spec_ok<Spec, true>()) {
    return 0;
  } else if constexpr (!pool_labels_in_input<Spec, X>(
                           std::make_integer_sequence<
                               int, parse_pool(Spec.view()).spec.spatial_count>{})) {
    return 0;
  } else {
    using T = typename X::value_type;
    using MeshT = typename X::mesh_type;
    static_assert(std::is_floating_point_v<T>, "gshard::max_pool/avg_pool need float or double");
    constexpr Layout L = infer_pool(X::layout, Kind == PoolKind::max);
    // Max pooling finishes a pending partial sum (the implicit collective of strict mode).
    static_assert(strict_check<MeshT, Name, 0, X::layout, L>());
    const std::string op = std::string(Name.view()) + " \"" + std::string(Spec.view()) + "\"";
    const RuntimeTensor<T> xr = materialise_as(x, L, op);
    constexpr ConvSpec spec = parse_pool(Spec.view()).spec;
    using R = Sharded<T, MeshT, spec_of<MeshT, L>()>;
    if (xr.grad && recording()) {
      ConvSaved<T> sv;
      RuntimeTensor<T> r =
          pool_runtime<T>(op, Kind, spec, opt, x.mesh().state(), axis_name_list<MeshT>(), xr, &sv);
      if (Kind == PoolKind::avg) sv.halo.data = {};  // the average's cotangent needs no values
      record(x.mesh(), r, op, std::source_location{}, {xr.grad},
             [cs = spec, sv, m = x.mesh()](const RuntimeTensor<T>& g) {
               return Cotangents{AnyTensor(
                   pool_input_cotangent<T>(Kind, cs, sv, g, m.state(), axis_name_list<MeshT>()))};
             });
      return sharded_from<R>(x.mesh(), r);
    }
    const RuntimeTensor<T> r =
        pool_runtime<T>(op, Kind, spec, opt, x.mesh().state(), axis_name_list<MeshT>(), xr);
    return R(x.mesh(), r.shape, r.data);
  }
}

}  // namespace detail

/// conv<"H:K W:L C->O">(x, w, options): cross-correlation of input x (labels include H, W, C)
/// with weights w (labels exactly O, C, K, L, any order), as PyTorch's conv with bias=False:
/// out[.., O, .., h, w] = sum_{C,K,L} x[.., C, .., h*s + k*d - pad, w*s + l*d - pad] w[O, C, k, l].
/// The result has x's labels in x's order with C replaced by O. Eager; collective.
template <fixed_string Spec, Expression X, Expression W>
auto conv(const X& x, const W& w, const ConvOptions& options = {},
          std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "conv");
  return detail::conv_typed<"conv", Spec, 0>(x, w, options);
}
/// conv with exactly one spatial label: conv1d<"L:K C->O">.
template <fixed_string Spec, Expression X, Expression W>
auto conv1d(const X& x, const W& w, const ConvOptions& options = {}) {
  return detail::conv_typed<"conv1d", Spec, 1>(x, w, options);
}
/// conv with exactly two spatial labels: conv2d<"H:K W:L C->O">.
template <fixed_string Spec, Expression X, Expression W>
auto conv2d(const X& x, const W& w, const ConvOptions& options = {}) {
  return detail::conv_typed<"conv2d", Spec, 2>(x, w, options);
}

/// max_pool<"HW">(x, {.window = {2, 2}}): the maximum over each window (no padding; stride
/// defaults to the window). A pending partial sum of x is finished first. Eager; collective.
template <fixed_string Spec, Expression X>
auto max_pool(const X& x, const PoolOptions& options,
              std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "max_pool");
  return detail::pool_typed<"max_pool", Spec, detail::PoolKind::max>(x, options);
}
/// avg_pool<"HW">(x, {.window = {2, 2}}): the mean over each window; linear, so pending partial
/// sums of x stay pending in the result.
template <fixed_string Spec, Expression X>
auto avg_pool(const X& x, const PoolOptions& options,
              std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "avg_pool");
  return detail::pool_typed<"avg_pool", Spec, detail::PoolKind::avg>(x, options);
}

}  // namespace gshard
