#pragma once
// merge, split, concat, slice and pad on run-time layouts, each a move of intervals through the
// interval exchange (spmd/interval.hpp), and the inverse moves their gradients record.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../../expr/node.hpp"
#include "../../kernels/copy_box.hpp"
#include "../../spmd/interval.hpp"
#include "../../spmd/reshard.hpp"
#include "../../tensor/sharded.hpp"
#include "rules.hpp"

namespace gshard {
namespace detail {

/// `t` in layout `need` (the planner's reshard; nothing when it is already there).
template <class T>
RuntimeTensor<T> shape_bring(const RuntimeTensor<T>& t, const Layout& need, const MeshState& mesh,
                             const std::vector<std::string>& axis_names, const std::string& op) {
  if (t.layout == need) return t;
  if (t.partial_op != ReduceOp::sum && !same_partial(t.layout, need))
    throw Error(op, "an operand " + quoted_layout(t.layout, axis_names) +
                        " holds pending max/min partials and would have to change them; finish "
                        "them with reshard first");
  return reshard_runtime(t, need, mesh, axis_names);
}

struct LineFrame {
  std::int64_t outer = 1;  // product of the padded local extents before the line's dimensions
  std::int64_t inner = 1;  // ... and after them
};

inline LineFrame line_frame(const Layout& l, const Shape& shape, int first, int last,
                            const std::array<int, max_axes>& sizes) {
  const Shape e = local_extents(l, shape, sizes);
  LineFrame f;
  for (int d = 0; d < first; ++d) f.outer *= e[static_cast<std::size_t>(d)];
  for (int d = last + 1; d < l.rank; ++d) f.inner *= e[static_cast<std::size_t>(d)];
  return f;
}

template <class T>
Kokkos::View<T*> zeros(std::int64_t n) {
  return Kokkos::View<T*>("gshard::shape", static_cast<std::size_t>(n));
}

inline int find_checked(const Layout& l, char label, const std::string& op,
                        const std::vector<std::string>& names) {
  const int d = l.find(label);
  if (d < 0)
    throw Error(op, "label '" + std::string(1, label) + "' is not in the operand's layout " +
                        quoted_layout(l, names));
  return d;
}

/// `src` (lines in blocks `from`, frame `f`) with its lines in blocks `to`: the same view when
/// they coincide, else exchanged.
template <class T>
Kokkos::View<T*> lines_to(const Kokkos::View<T*>& src, const LineBlocks& from, const LineBlocks& to,
                          const LineFrame& f, const MeshState& mesh,
                          const std::vector<std::string>& axis_names) {
  if (lines_coincide(from, to, mesh)) return src;
  const LineSpan mine = span_of(to, mesh.sizes, mesh.coords);
  Kokkos::View<T*> out = zeros<T>(f.outer * mine.chunk * f.inner);
  interval_exchange<T>({LineSource<T>{src.data(), from}}, to, f.outer, f.inner, out.data(), mesh,
                       axis_names);
  return out;
}

/// merge on run-time layouts: `labels` (two or more, major first) become the one label `merged`.
template <class T>
RuntimeTensor<T> merge_runtime(const RuntimeTensor<T>& x, std::string_view labels, char merged,
                               const MeshState& mesh, const std::vector<std::string>& axis_names) {
  const std::string op =
      std::string("merge<\"").append(labels) + "\", \"" + std::string(1, merged) + "\">";
  if (labels.size() < 2 || repeated_at(labels) >= 0)
    throw Error(op, "give two or more distinct labels to merge");
  for (char c : labels) (void)find_checked(x.layout, c, op, axis_names);
  if (x.layout.find(merged) >= 0 && labels.find(merged) == std::string_view::npos)
    throw Error(op,
                "the merged label is already a label of " + quoted_layout(x.layout, axis_names));
  const Layout staging = merge_staging_layout(x.layout, labels);
  const Layout result = merge_layout(x.layout, labels, merged);
  const RuntimeTensor<T> s = shape_bring(x, staging, mesh, axis_names, op);
  const int d = staging.find(labels[0]);
  const int last = d + static_cast<int>(labels.size()) - 1;
  std::int64_t unit = 1;
  for (int i = d + 1; i <= last; ++i) unit *= s.shape[static_cast<std::size_t>(i)];
  const std::int64_t major = s.shape[static_cast<std::size_t>(d)];
  RuntimeTensor<T> out{result, {}, {}, x.partial_op};
  for (int i = 0; i < s.layout.rank; ++i) {
    if (i > d && i <= last) continue;
    out.shape.push_back(i == d ? major * unit : s.shape[static_cast<std::size_t>(i)]);
  }
  const LineBlocks from{staging.dims[d], major, unit, 0, 0, major * unit};
  const LineBlocks to{result.dims[d], major * unit, 1, 0, 0, major * unit};
  // Coinciding lines: the same bytes under the merged label.
  out.data = lines_to<T>(s.data, from, to, line_frame(s.layout, s.shape, d, last, mesh.sizes), mesh,
                         axis_names);
  return out;
}

/// split on run-time layouts: `label` becomes `into` (two or more, major first) of `sizes`.
template <class T>
RuntimeTensor<T> split_runtime(const RuntimeTensor<T>& x, char label, std::string_view into,
                               const Shape& sizes, const MeshState& mesh,
                               const std::vector<std::string>& axis_names) {
  const std::string op =
      std::string("split<\"") + std::string(1, label) + "\", \"" + std::string(into) + "\">";
  const int d = find_checked(x.layout, label, op, axis_names);
  if (into.size() < 2 || repeated_at(into) >= 0)
    throw Error(op, "give two or more distinct labels to split into");
  for (char c : into)
    if (c != label && x.layout.find(c) >= 0)
      throw Error(op, "new label '" + std::string(1, c) + "' is already a label of " +
                          quoted_layout(x.layout, axis_names));
  if (x.layout.rank - 1 + static_cast<int>(into.size()) > max_dims)
    throw Error(op, "the result would have more than 8 dimensions");
  const std::int64_t n = x.shape[static_cast<std::size_t>(d)];
  std::int64_t product_of_sizes = 1;
  bool negative = false;
  for (auto v : sizes) {
    product_of_sizes *= v;
    negative = negative || v < 0;
  }
  if (sizes.size() != into.size() || negative || product_of_sizes != n)
    throw Error(op, "sizes " + shape_string(sizes) + " for \"" + std::string(into) +
                        "\" must be one non-negative size per label, multiplying to the size " +
                        std::to_string(n) + " of '" + std::string(1, label) +
                        "' (operand global shape " + shape_string(x.shape) + ", layout " +
                        quoted_layout(x.layout, axis_names) + ")");
  const Layout result = split_layout(x.layout, label, into);
  RuntimeTensor<T> out{result, {}, {}, x.partial_op};
  for (int i = 0; i < x.layout.rank; ++i) {
    if (i != d) {
      out.shape.push_back(x.shape[static_cast<std::size_t>(i)]);
      continue;
    }
    for (auto v : sizes) out.shape.push_back(v);
  }
  const std::int64_t major = sizes[0];
  std::int64_t minor = 1;
  for (std::size_t i = 1; i < sizes.size(); ++i) minor *= sizes[i];
  const LineBlocks from{x.layout.dims[d], n, 1, 0, 0, n};
  const LineBlocks to{result.dims[d], major, minor, 0, 0, n};
  out.data = lines_to<T>(x.data, from, to, line_frame(x.layout, x.shape, d, d, mesh.sizes), mesh,
                         axis_names);
  return out;
}

/// The box fill_line writes (a namespace-scope type: device lambdas may not capture local ones).
struct FillFrame {
  int rank;
  std::int64_t extent[max_dims];  // the box: valid positions, the filled range along the line
  std::int64_t chunk[max_dims];   // padded local extents
  std::int64_t start[max_dims];   // the box's first local index along each dimension
  std::int64_t stride[max_dims];
};

/// Fills result line positions [a, b) of this rank's block with `value`, where the other
/// dimensions are valid too (their padding stays zero). Skipped on copies other than partial
/// coordinate 0 when the result is a pending sum: the value is counted once.
template <class T>
void fill_line(Kokkos::View<T*> out, const RuntimeTensor<T>& r, const LineBlocks& to, int d,
               std::int64_t a, std::int64_t b, T value, const MeshState& mesh) {
  if (value == T{}) return;
  if (r.partial_op == ReduceOp::sum)
    for (int i = 0; i < r.layout.partial_count; ++i)
      if (mesh.coords[static_cast<std::size_t>(r.layout.partial[i])] != 0) return;
  const LineSpan mine = span_of(to, mesh.sizes, mesh.coords);
  const std::int64_t lo = std::max(a, mine.begin);
  const std::int64_t hi = std::min(b, mine.end);
  if (hi <= lo) return;
  FillFrame f{};
  f.rank = r.layout.rank;
  std::int64_t count = 1;
  for (int i = 0; i < f.rank; ++i) {
    const Block blk =
        block_of(r.layout.dims[i], r.shape[static_cast<std::size_t>(i)], mesh.sizes, mesh.coords);
    f.extent[i] = i == d ? hi - lo : blk.valid;  // only valid positions are visited
    f.start[i] = i == d ? lo - mine.origin : 0;
    f.chunk[i] = blk.chunk;
    count *= f.extent[i];
  }
  std::int64_t s = 1;
  for (int i = f.rank - 1; i >= 0; --i) {
    f.stride[i] = s;
    s *= f.chunk[i];
  }
  T* data = out.data();
  Kokkos::parallel_for(
      "gshard::pad fill", Kokkos::RangePolicy<>(0, count), KOKKOS_LAMBDA(std::int64_t i) {
        std::int64_t at = 0;
        for (int k = f.rank - 1; k >= 0; --k) {
          at += (f.start[k] + i % f.extent[k]) * f.stride[k];
          i /= f.extent[k];
        }
        data[at] = value;
      });
}

/// The shift engine of concat, slice and pad: result line position o along `label` comes from
/// source i's position o - shifts[i] when o is in [begin, end) (the sources' ranges do not
/// overlap); positions [0, fill_lo) and [fill_hi, size) hold `fill`; the result has the
/// sources' (common) layout `result`.
template <class T>
RuntimeTensor<T> shifted_runtime(const std::vector<RuntimeTensor<T>>& xs,
                                 const std::vector<std::int64_t>& shifts, const Layout& result,
                                 char label, std::int64_t begin, std::int64_t end,
                                 std::int64_t size, T fill, std::int64_t fill_lo,
                                 std::int64_t fill_hi, const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  const int d = result.find(label);
  RuntimeTensor<T> out{result, xs[0].shape, {}, xs[0].partial_op};
  out.shape[static_cast<std::size_t>(d)] = size;
  const LineBlocks to{result.dims[d], size, 1, 0, 0, size};
  const LineFrame f = line_frame(result, out.shape, d, d, mesh.sizes);
  const LineSpan mine = span_of(to, mesh.sizes, mesh.coords);
  out.data = zeros<T>(f.outer * mine.chunk * f.inner);
  fill_line(out.data, out, to, d, 0, fill_lo, fill, mesh);
  fill_line(out.data, out, to, d, fill_hi, size, fill, mesh);
  std::vector<LineSource<T>> sources;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const std::int64_t n = xs[i].shape[static_cast<std::size_t>(d)];
    sources.push_back(
        {xs[i].data.data(), LineBlocks{xs[i].layout.dims[d], n, 1, shifts[i], begin, end}});
  }
  interval_exchange<T>(sources, to, f.outer, f.inner, out.data.data(), mesh, axis_names);
  return out;
}

/// slice on run-time layouts: [begin, end) along `label`; the result keeps the layout.
template <class T>
RuntimeTensor<T> slice_runtime(const RuntimeTensor<T>& x, char label, std::int64_t begin,
                               std::int64_t end, const MeshState& mesh,
                               const std::vector<std::string>& axis_names) {
  const std::string op = std::string("slice<\"") + std::string(1, label) + "\">";
  const int d = find_checked(x.layout, label, op, axis_names);
  const std::int64_t n = x.shape[static_cast<std::size_t>(d)];
  if (begin < 0 || end < begin || end > n)
    throw Error(op, "range [" + std::to_string(begin) + ", " + std::to_string(end) +
                        ") is not within [0, " + std::to_string(n) + ") of '" +
                        std::string(1, label) + "' (operand global shape " + shape_string(x.shape) +
                        ", layout " + quoted_layout(x.layout, axis_names) + ")");
  if (begin == 0 && end == n) return x;
  return shifted_runtime<T>({x}, {-begin}, x.layout, label, 0, end - begin, end - begin, T{}, 0, 0,
                            mesh, axis_names);
}

/// pad on run-time layouts: `before` and `after` positions of `value` along `label`.
template <class T>
RuntimeTensor<T> pad_runtime(const RuntimeTensor<T>& x, char label, std::int64_t before,
                             std::int64_t after, T value, const MeshState& mesh,
                             const std::vector<std::string>& axis_names) {
  const std::string op = std::string("pad<\"") + std::string(1, label) + "\">";
  const int d = find_checked(x.layout, label, op, axis_names);
  const std::int64_t n = x.shape[static_cast<std::size_t>(d)];
  if (before < 0 || after < 0)
    throw Error(op, "before " + std::to_string(before) + " and after " + std::to_string(after) +
                        " must not be negative (operand global shape " + shape_string(x.shape) +
                        ", layout " + quoted_layout(x.layout, axis_names) + ")");
  if (before == 0 && after == 0) return x;
  const std::int64_t size = n + before + after;
  return shifted_runtime<T>({x}, {before}, x.layout, label, 0, size, size, value, before,
                            before + n, mesh, axis_names);
}

/// concat on run-time layouts: the operands one after the other along `label`, in the first
/// operand's layout (partial axes: the union).
template <class T>
RuntimeTensor<T> concat_runtime(const std::vector<RuntimeTensor<T>>& xs, char label,
                                const MeshState& mesh, const std::vector<std::string>& axis_names) {
  const std::string op = std::string("concat<\"") + std::string(1, label) + "\">";
  if (xs.empty()) throw Error(op, "no operands");
  const Layout& first = xs[0].layout;
  Layout result = first;
  for (const auto& x : xs) {
    (void)find_checked(x.layout, label, op, axis_names);
    bool same = x.layout.rank == first.rank;
    for (int d = 0; same && d < first.rank; ++d) same = x.layout.find(first.dims[d].label) >= 0;
    bool sizes_agree = same;
    for (int d = 0; sizes_agree && d < first.rank; ++d)
      sizes_agree = first.dims[d].label == label ||
                    xs[0].shape[static_cast<std::size_t>(d)] ==
                        x.shape[static_cast<std::size_t>(x.layout.find(first.dims[d].label))];
    if (!sizes_agree)
      throw Error(op, "operands " + quoted_layout(first, axis_names) + " of global shape " +
                          shape_string(xs[0].shape) + " and " +
                          quoted_layout(x.layout, axis_names) + " of global shape " +
                          shape_string(x.shape) + " differ in labels or in sizes other than '" +
                          std::string(1, label) + "'");
    if (x.partial_op != xs[0].partial_op && (x.layout.partial_count || first.partial_count))
      throw Error(op, "operands hold pending partials of different kinds (sum, max, min)");
    result = concat_layout(result, x.layout);
  }
  std::vector<RuntimeTensor<T>> brought;
  std::vector<std::int64_t> shifts;
  std::int64_t size = 0;
  for (const auto& x : xs) {
    brought.push_back(
        shape_bring(x, concat_operand_layout(result, x.layout, label), mesh, axis_names, op));
    shifts.push_back(size);
    size += x.shape[static_cast<std::size_t>(x.layout.find(label))];
  }
  return shifted_runtime<T>(brought, shifts, result, label, 0, size, size, T{}, 0, 0, mesh,
                            axis_names);
}

template <class T, class MeshT, Layout L>
Sharded<T, MeshT, spec_of<MeshT, L>()> to_sharded(const MeshT& mesh, const RuntimeTensor<T>& r) {
  Sharded<T, MeshT, spec_of<MeshT, L>()> out(mesh, r.shape, r.data);
  detail::set_partial_op(out, r.partial_op);
  detail::set_grad_node(out, r.grad);
  return out;
}

// --- gradients ------------------------------------------------------------------------------
// Every shape op is linear and moves each element at most once, so its backward is the inverse
// move of the cotangent (merge <-> split, slice <-> pad with zeros, concat -> one slice per
// operand) through the same engine: sharded like the forward, no values saved, and correct on a
// cotangent still partial over axes the result does not use.

/// `out` recorded as made by shape op `op` from `inputs` (nothing when none is tracked or the
/// type is not differentiable). A result that is an input's own value (an identity slice or pad)
/// gets its own node, so every result is either recorded or untracked.
template <class T, class MeshT, class Backward>
void record_shape(const MeshT& mesh, RuntimeTensor<T>& out, const std::string& op,
                  std::vector<std::shared_ptr<GradNode>> inputs, Backward backward) {
  out.grad = nullptr;
  if constexpr (differentiable_v<T>) {
    record(mesh, out, op, std::source_location{}, std::move(inputs),
           [b = std::move(backward)](const RuntimeTensor<T>& g) {
             return Cotangents{AnyTensor(b(g))};
           });
  }
}

/// merge's backward: the merged label split back into `labels` of their input `sizes` (layout:
/// the labels adjacent, the first holding the merged label's axes; the driver reshards it).
template <class T>
RuntimeTensor<T> merge_cotangent(const RuntimeTensor<T>& g, std::string_view labels, char merged,
                                 const Shape& sizes, const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  return split_runtime<T>(g, merged, labels, sizes, mesh, axis_names);
}

/// split's backward: the labels `into` merged back into `label`.
template <class T>
RuntimeTensor<T> split_cotangent(const RuntimeTensor<T>& g, char label, std::string_view into,
                                 const MeshState& mesh,
                                 const std::vector<std::string>& axis_names) {
  return merge_runtime<T>(g, into, label, mesh, axis_names);
}

/// concat's backward for one operand: positions [offset, offset + size) of `label`, moved
/// straight into the operand's own split along `label` (as the forward moved it out), the other
/// dimensions as the cotangent has them.
template <class T>
RuntimeTensor<T> concat_cotangent(const RuntimeTensor<T>& g, const Layout& operand, char label,
                                  std::int64_t offset, std::int64_t size, const MeshState& mesh,
                                  const std::vector<std::string>& axis_names) {
  const Layout l = concat_operand_layout(g.layout, operand, label);
  return shifted_runtime<T>({g}, {-offset}, l, label, 0, size, size, T{}, 0, 0, mesh, axis_names);
}

}  // namespace detail

}  // namespace gshard
