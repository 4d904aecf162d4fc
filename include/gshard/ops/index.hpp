#pragma once
// Index ops: take<"V">(table, indices) (gather along a label; the embedding lookup when the table
// is split over its vocabulary label, as Megatron does it) and scatter_add<"V">(values, indices,
// n), its transpose. The local kernels and the partition rules live side by side here.
//
// Rules (constexpr, the same functions at compile time and in the run-time engine):
//   take<"V">(table "V M...", indices "B S...") -> "B S... M..." (the indices' labels, then the
//   table's other labels). The index labels keep the indices' splits; a table label keeps its
//   axes when the indices do not use them (else it is replicated: the table is gathered). When
//   the indices use none of V's axes, V stays split: every rank looks up only the indices that
//   fall in its vocabulary shard (zeros elsewhere) and the result is a pending partial sum over
//   V's axes (no communication). Otherwise the table is gathered over V first. The table's
//   pending partial sums stay pending over axes the indices do not use.
//   scatter_add<"V">(values "B S... M...", indices "B S...", n) -> "V M..." (V first, replicated,
//   then the values' other labels with their axes). The indices are brought to the values' splits
//   of the index labels; each rank adds its own values, so the result is a pending partial sum
//   over those axes (and over the values' own pending axes): no communication for the data.
//
// Out-of-range indices throw gshard::Error on every rank. Ranks that hold different index
// shards must agree, so each rank checks its own shard and one AllReduce of 3 integers runs over
// exactly the mesh axes that split the indices (none when the indices are replicated, as in the
// usual embedding lookup). That check is not a reshard, so strict mode does not reject it.
//
// Gradients (the table's, the values'; indices get none): the backward of take is a scatter_add
// of the cotangent at the indices the lookup used, straight into the table's layout of V in the
// lookup (each rank adds into its own vocabulary shard when V stayed split, so the embedding
// gradient is never replicated at the table's size), partial over the axes splitting the
// indices; the backward of scatter_add is a take of the cotangent. Neither re-checks the indices
// nor communicates; the driver finishes the partial sums when it brings the cotangent home.
//
// Batched (MoE dispatch/combine): take_along<"S">(table, indices) and its transpose
// scatter_add_along<"S", "Batch">(values, indices, n). Labels shared by the table and the indices
// are batch labels; a negative index means "no element" (zero row, no gradient, nothing added).
//   take_along: table "G S M", indices "G E C" -> "G E C M". The indices keep their splits; the
//   table's batch labels take them, S is replicated (the table is gathered over S if split), the
//   table's other labels keep their axes where the indices leave them free; table partials stay
//   pending over the free axes. So batch labels split alike and S unsplit: no data moves.
//   scatter_add_along: values "G E C M", indices "G E C", Batch "G" -> "G S M" (batch labels in
//   the values' order, S replicated, the values' labels the indices lack). The values stay; the
//   indices take their splits; pending over the axes of the non-batch index labels (E, C).
// Bounds::checked (the default) runs the same one-AllReduce check as take (indices >= n throw on
// every rank); Bounds::trusted skips it, so the fast path then runs no collective at all.
// Gradients: take_along's table cotangent is a local scatter of g at the used indices (in g's
// splits); scatter_add_along's values cotangent is a take_along of g.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../comm/collectives.hpp"
#include "../expr/node.hpp"
#include "../kernels/math.hpp"
#include "../kernels/rows.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

/// How take_along / scatter_add_along treat an index >= the indexed size.
enum class Bounds {
  checked,  // gshard::Error on every rank (one AllReduce of 3 int64 over the axes splitting the
            // indices; none when they are replicated)
  trusted,  // no check, no collective (the caller vouches); such an index selects nothing
};

namespace index_error {
template <class>
inline constexpr bool always_false = false;
template <auto Label, auto Spec>
struct label_must_be_one_letter {
  static_assert(always_false<label_must_be_one_letter>,
                "gshard::take/scatter_add: name the indexed label with one letter, e.g. <\"V\">");
};
template <auto Label, auto TableSpec>
struct indexed_label_not_in_table {
  static_assert(always_false<indexed_label_not_in_table>,
                "gshard::take: the table has no such label (the label, the table's spec)");
};
template <auto IndicesSpec>
struct indices_must_be_int32_or_int64 {
  static_assert(always_false<indices_must_be_int32_or_int64>,
                "gshard::take/scatter_add: the index tensor must hold int32_t or int64_t");
};
template <auto Label, auto TableSpec, auto IndicesSpec>
struct index_label_also_in_table {
  static_assert(always_false<index_label_also_in_table>,
                "gshard::take: a label of the index tensor is also a table label; rename it with "
                ".as<\"...\">()");
};
template <auto Label, auto ValuesSpec, auto IndicesSpec>
struct index_label_not_in_values {
  static_assert(
      always_false<index_label_not_in_values>,
      "gshard::scatter_add: every label of the index tensor must be a label of the values");
};
template <auto Label, auto ValuesSpec>
struct scattered_label_already_in_values {
  static_assert(always_false<scattered_label_already_in_values>,
                "gshard::scatter_add: the values already have the label scattered into");
};
template <auto TableSpec, auto IndicesSpec>
struct result_has_more_than_8_labels {
  static_assert(always_false<result_has_more_than_8_labels>,
                "gshard::take: the result would have more than 8 labels");
};
template <auto Label, auto TableSpec>
struct along_label_not_in_table {
  static_assert(always_false<along_label_not_in_table>,
                "gshard::take_along: the table has no such label (the label, the table's spec)");
};
template <auto Label, auto IndicesSpec>
struct along_label_in_indices {
  static_assert(always_false<along_label_in_indices>,
                "gshard::take_along/scatter_add_along: the indexed label must not be a label of "
                "the index tensor");
};
template <auto Label, auto ValuesSpec>
struct along_label_already_in_values {
  static_assert(always_false<along_label_already_in_values>,
                "gshard::scatter_add_along: the values already have the label scattered into");
};
template <auto Label, auto ValuesSpec, auto IndicesSpec>
struct along_index_label_not_in_values {
  static_assert(always_false<along_index_label_not_in_values>,
                "gshard::scatter_add_along: every label of the index tensor must be a label of "
                "the values");
};
template <auto Label, auto Batch, auto IndicesSpec>
struct along_batch_label_not_in_indices {
  static_assert(always_false<along_batch_label_not_in_indices>,
                "gshard::scatter_add_along: every batch label must be a label of the index tensor");
};
template <auto First, auto Second>
struct along_result_has_more_than_8_labels {
  static_assert(always_false<along_result_has_more_than_8_labels>,
                "gshard::take_along/scatter_add_along: the result would have more than 8 labels");
};
}  // namespace index_error

namespace detail {

/// The layouts take<"V"> needs its operands in, and its result's.
struct TakeLayouts {
  Layout table{};
  Layout indices{};
  Layout output{};
  bool ok = true;  // false: the result would have more than max_dims labels
};

constexpr TakeLayouts take_layouts(const Layout& table, const Layout& indices, char label) {
  TakeLayouts r;
  const int vd = table.find(label);
  if (indices.rank + table.rank - 1 > max_dims) {
    r.ok = false;
    return r;
  }
  bool used[max_axes]{};
  r.indices = finished_layout(indices);  // indexing is not linear in the indices: finish sums
  r.output.rank = 0;
  for (int d = 0; d < indices.rank; ++d) {
    r.output.dims[r.output.rank++] = indices.dims[d];
    for (int i = 0; i < indices.dims[d].axis_count; ++i) used[indices.dims[d].axes[i]] = true;
  }
  r.table = finished_layout(table);
  for (int d = 0; d < table.rank; ++d) {
    if (d == vd) continue;
    DimLayout dim = table.dims[d];
    bool free = true;
    for (int i = 0; i < dim.axis_count; ++i) free = free && !used[dim.axes[i]];
    if (!free) {
      dim.axis_count = 0;
      dim.axes = {};
    }
    r.table.dims[d] = dim;
    r.output.dims[r.output.rank++] = dim;
  }
  if (vd >= 0) {
    const DimLayout& v = table.dims[vd];
    bool free = true;
    for (int i = 0; i < v.axis_count; ++i) free = free && !used[v.axes[i]];
    if (free) {
      for (int i = 0; i < v.axis_count; ++i) r.output.partial[r.output.partial_count++] = v.axes[i];
    } else {
      r.table.dims[vd].axis_count = 0;
      r.table.dims[vd].axes = {};
    }
  }
  for (int i = 0; i < table.partial_count; ++i) {
    const int a = table.partial[i];
    if (used[a]) continue;
    r.table.partial[r.table.partial_count++] = a;
    r.output.partial[r.output.partial_count++] = a;
  }
  return r;
}

constexpr bool along_has_label(std::string_view labels, char c) {
  for (const char l : labels)
    if (l == c && c != ' ') return true;
  return false;
}

/// A scatter's indices take the values' splits of their labels; its result is pending over the
/// axes splitting the index labels that are not batch labels (each rank adds its own rows only).
constexpr Layout scatter_indices_layout(const Layout& values, const Layout& indices, Layout& output,
                                        std::string_view batch = {}) {
  Layout r = finished_layout(indices);
  for (int d = 0; d < indices.rank; ++d) {
    const int vd = values.find(indices.dims[d].label);
    DimLayout dim = indices.dims[d];
    dim.axis_count = vd >= 0 ? values.dims[vd].axis_count : 0;
    dim.axes = vd >= 0 ? values.dims[vd].axes : std::array<int, max_axes>{};
    r.dims[d] = dim;
    if (along_has_label(batch, dim.label)) continue;
    for (int i = 0; i < dim.axis_count; ++i) output.partial[output.partial_count++] = dim.axes[i];
  }
  return r;
}

/// The layouts scatter_add<"V"> needs its operands in, and its result's.
struct ScatterLayouts {
  Layout values{};
  Layout indices{};
  Layout output{};
};

constexpr ScatterLayouts scatter_layouts(const Layout& values, const Layout& indices, char label) {
  ScatterLayouts r;
  r.values = values;
  r.indices = scatter_indices_layout(values, indices, r.output);
  r.output.rank = 1;
  r.output.dims[0].label = label;
  for (int d = 0; d < values.rank; ++d)
    if (indices.find(values.dims[d].label) < 0) r.output.dims[r.output.rank++] = values.dims[d];
  for (int i = 0; i < values.partial_count; ++i)
    r.output.partial[r.output.partial_count++] = values.partial[i];
  return r;
}

/// The layouts take_along / scatter_add_along need their operands in, and their result's.
struct AlongLayouts {
  Layout data{};  // take_along: the table; scatter_add_along: the values
  Layout indices{};
  Layout output{};
  bool ok = true;  // false: the result would have more than max_dims labels
};

/// take_along<label>: the indices keep their splits (finished); the table's batch labels (those
/// of the indices) take the indices' splits, the indexed label is replicated and the table's
/// other labels keep their axes where the indices leave them free (else replicated). Result: the
/// indices' labels, then the table's others; pending over the table's partial axes left free.
constexpr AlongLayouts take_along_layouts(const Layout& table, const Layout& indices, char label) {
  AlongLayouts r;
  int batch = 0;
  for (int d = 0; d < indices.rank; ++d) batch += table.find(indices.dims[d].label) >= 0 ? 1 : 0;
  if (indices.rank + table.rank - 1 - batch > max_dims) {
    r.ok = false;
    return r;
  }
  bool used[max_axes]{};
  r.indices = finished_layout(indices);
  r.output.rank = 0;
  for (int d = 0; d < indices.rank; ++d) {
    r.output.dims[r.output.rank++] = indices.dims[d];
    for (int i = 0; i < indices.dims[d].axis_count; ++i) used[indices.dims[d].axes[i]] = true;
  }
  r.data = finished_layout(table);
  for (int d = 0; d < table.rank; ++d) {
    DimLayout dim = table.dims[d];
    const int id = indices.find(dim.label);
    bool free = id < 0 && dim.label != label;
    for (int i = 0; i < dim.axis_count; ++i) free = free && !used[dim.axes[i]];
    if (id >= 0) {
      dim.axis_count = indices.dims[id].axis_count;
      dim.axes = indices.dims[id].axes;
    } else if (!free) {
      dim.axis_count = 0;
      dim.axes = {};
    }
    r.data.dims[d] = dim;
    if (id < 0 && dim.label != label) r.output.dims[r.output.rank++] = dim;
  }
  for (int i = 0; i < table.partial_count; ++i) {
    const int a = table.partial[i];
    if (used[a]) continue;
    r.data.partial[r.data.partial_count++] = a;
    r.output.partial[r.output.partial_count++] = a;
  }
  return r;
}

/// scatter_add_along<label, batch>: the values stay as they are; the indices take the values'
/// splits of their labels. Result: the batch labels (in the values' order), the scattered label
/// (replicated), then the values' labels the indices lack; pending over the axes splitting the
/// values' non-batch index labels and over the values' own pending axes.
constexpr AlongLayouts scatter_along_layouts(const Layout& values, const Layout& indices,
                                             char label, std::string_view batch) {
  AlongLayouts r;
  int count = 1;
  for (int d = 0; d < values.rank; ++d) {
    const char c = values.dims[d].label;
    count += indices.find(c) < 0 || along_has_label(batch, c) ? 1 : 0;
  }
  if (count > max_dims) {
    r.ok = false;
    return r;
  }
  r.data = values;
  r.indices = scatter_indices_layout(values, indices, r.output, batch);
  r.output.rank = 0;
  for (int d = 0; d < values.rank; ++d)
    if (indices.find(values.dims[d].label) >= 0 && along_has_label(batch, values.dims[d].label))
      r.output.dims[r.output.rank++] = values.dims[d];
  r.output.dims[r.output.rank++].label = label;
  for (int d = 0; d < values.rank; ++d)
    if (indices.find(values.dims[d].label) < 0) r.output.dims[r.output.rank++] = values.dims[d];
  for (int i = 0; i < values.partial_count; ++i)
    r.output.partial[r.output.partial_count++] = values.partial[i];
  return r;
}

namespace index_ops {

inline std::string describe(const Layout& l, const Shape& shape,
                            const std::vector<std::string>& names) {
  return "\"" + layout_text(l, names) + "\" of shape " + shape_string(shape);
}

/// `t` in layout `need` (same labels): resharded when the layouts differ.
template <class T>
RuntimeTensor<T> bring(const RuntimeTensor<T>& t, const Layout& need, const MeshState& mesh,
                       const std::vector<std::string>& names, const std::string& op) {
  if (t.layout == need) return t;
  if (t.partial_op != ReduceOp::sum && need.partial_count > 0)
    throw Error(op, "an operand holds pending max/min partials; finish them with reshard first");
  const ReshardPlan plan = plan_reshard(t.layout, need, t.shape, mesh.sizes, mesh.coords, names,
                                        static_cast<std::int64_t>(sizeof(T)));
  RuntimeTensor<T> out{need, shape_in(need, t.layout, t.shape), {}, t.partial_op};
  out.data = ReshardExecutor<T>(plan, mesh, t.partial_op).run(t.data);
  return out;
}

/// The non-trivial mesh axes (size > 1) that split some dimension of `l`, as a mask.
inline unsigned split_mask(const Layout& l, const std::array<int, max_axes>& sizes) {
  unsigned mask = 0;
  for (int d = 0; d < l.rank; ++d)
    for (int i = 0; i < l.dims[d].axis_count; ++i)
      if (sizes[static_cast<std::size_t>(l.dims[d].axes[i])] > 1) mask |= 1u << l.dims[d].axes[i];
  return mask;
}

/// Throws on every rank when some index lies outside [0, n) (or is >= n, when negative_ok). Each
/// rank scans its own shard; ranks holding different shards agree through one AllReduce (max of:
/// any bad, the largest bad value, minus the smallest) over the axes that split the indices.
template <class I>
void check_indices(const RuntimeTensor<I>& idx, std::int64_t n, const MeshState& mesh,
                   const std::vector<std::string>& names, const std::string& op,
                   const std::string& context, bool negative_ok = false) {
  auto host = Kokkos::create_mirror_view(idx.data);
  Kokkos::deep_copy(host, idx.data);
  BlockIndex b = block_index(idx.layout, idx.shape, mesh.sizes, mesh.coords);
  b.holds_values = true;
  std::int64_t found[3] = {0, INT64_MIN, INT64_MIN};  // any bad, max bad, -(min bad)
  const auto count = static_cast<std::int64_t>(host.extent(0));
  for (std::int64_t i = 0; i < count; ++i) {
    if (b.global_of(i) < 0) continue;
    const auto v = static_cast<std::int64_t>(host(i));
    if ((v >= 0 || negative_ok) && v < n) continue;
    found[0] = 1;
    found[1] = v > found[1] ? v : found[1];
    found[2] = -v > found[2] ? -v : found[2];
  }
  const unsigned mask = split_mask(idx.layout, mesh.sizes);
  if (mask != 0) all_reduce(found, 3, ReduceOp::max, mesh.groups[mask], axes_string(mask, names));
  if (found[0] == 0) return;
  const std::string range =
      negative_ok ? "below " + std::to_string(n) + " (a negative index means no element)"
                  : "in [0, " + std::to_string(n) + ")";
  throw Error(op, context + ": indices must lie " + range + "; found values from " +
                      std::to_string(-found[2]) + " to " + std::to_string(found[1]) +
                      " outside it");
}

/// Per dimension of a local block: padded extent, valid extent, global offset, local stride.
struct LocalDims {
  std::int64_t extent[max_dims]{};
  std::int64_t valid[max_dims]{};
  std::int64_t offset[max_dims]{};
  std::int64_t stride[max_dims]{};
  std::int64_t size = 1;
};

inline LocalDims local_dims(const Layout& l, const Shape& shape, const MeshState& mesh) {
  LocalDims r;
  for (int d = l.rank - 1; d >= 0; --d) {
    const Block b =
        block_of(l.dims[d], shape[static_cast<std::size_t>(d)], mesh.sizes, mesh.coords);
    r.extent[d] = b.chunk;
    r.valid[d] = b.valid;
    r.offset[d] = b.offset;
    r.stride[d] = r.size;
    r.size *= b.chunk;
  }
  return r;
}

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

/// take along `label` on run-time layouts: bring the operands to the rule's layouts, check the
/// indices, look up locally. The typed take below and the property tests both run this.
/// `used_indices` receives the indices in the layout the lookup used (kept for the backward);
/// check = false skips the range check (indices already checked by the forward pass).
template <class T, class I>
RuntimeTensor<T> take_runtime(char label, const MeshState& mesh,
                              const std::vector<std::string>& names, const RuntimeTensor<T>& table,
                              const RuntimeTensor<I>& indices, const TakeLayouts* fixed = nullptr,
                              RuntimeTensor<I>* used_indices = nullptr, bool check = true) {
  using namespace index_ops;
  const std::string op = std::string("take<\"") + label + "\">";
  const std::string context = "table " + describe(table.layout, table.shape, names) + ", indices " +
                              describe(indices.layout, indices.shape, names);
  const int vd = table.layout.find(label);
  if (vd < 0) throw Error(op, context + ": the table has no label '" + label + "'");
  for (int d = 0; d < indices.layout.rank; ++d)
    if (table.layout.find(indices.layout.dims[d].label) >= 0)
      throw Error(op, context + ": label '" + indices.layout.dims[d].label +
                          "' is in both the table and the indices");
  const TakeLayouts rules = fixed ? *fixed : take_layouts(table.layout, indices.layout, label);
  if (!rules.ok) throw Error(op, context + ": the result would have more than 8 labels");
  const std::int64_t n = table.shape[static_cast<std::size_t>(vd)];
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  if (check) check_indices(idx, n, mesh, names, op, context);
  if (used_indices) *used_indices = idx;
  const RuntimeTensor<T> tab = bring(table, rules.table, mesh, names, op);
  if (tab.partial_op != ReduceOp::sum && rules.output.partial_count > 0)
    throw Error(op, context +
                        ": the table holds pending max/min partials; finish them with "
                        "reshard first");
  RuntimeTensor<T> out{rules.output, idx.shape, {}, ReduceOp::sum};
  for (int d = 0; d < tab.layout.rank; ++d)
    if (d != vd) out.shape.push_back(tab.shape[static_cast<std::size_t>(d)]);
  const LocalDims lo = local_dims(out.layout, out.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  const LocalDims lt = local_dims(tab.layout, tab.shape, mesh);
  GatherMap m;
  m.rank = out.layout.rank;
  for (int d = 0; d < m.rank; ++d) {
    m.extent[d] = lo.extent[d];
    m.valid[d] = lo.valid[d];
    if (d < idx.layout.rank) {
      m.a_stride[d] = li.stride[d];
    } else {
      m.b_stride[d] = lt.stride[tab.layout.find(out.layout.dims[d].label)];
    }
  }
  m.v_stride = lt.stride[vd];
  m.v_offset = lt.offset[vd];
  m.v_valid = lt.valid[vd];
  out.data = gather<T, I>("gshard::take", m, lo.size, idx.data, tab.data);
  return out;
}

namespace index_ops {

/// The local half of scatter_add: `values` into a zeroed `label` dimension of size n laid out as
/// `vdim` (its axes must be free in `values`), the indices already in the values' splits of the
/// index labels and checked. Each rank adds the values whose index falls in its own block of
/// `vdim` (all of them when `vdim` is replicated): the result is "V M..." partial over the axes
/// that split the values' index labels and over the values' own pending axes.
template <class T, class I>
RuntimeTensor<T> scatter_local(char label, std::int64_t n, const DimLayout& vdim,
                               const MeshState& mesh, const RuntimeTensor<T>& values,
                               const RuntimeTensor<I>& idx) {
  Layout l = scatter_layouts(values.layout, idx.layout, label).output;
  l.dims[0].axis_count = vdim.axis_count;
  l.dims[0].axes = vdim.axes;
  RuntimeTensor<T> out{l, {n}, {}, ReduceOp::sum};
  for (int d = 0; d < values.layout.rank; ++d)
    if (idx.layout.find(values.layout.dims[d].label) < 0)
      out.shape.push_back(values.shape[static_cast<std::size_t>(d)]);
  const LocalDims lo = local_dims(out.layout, out.shape, mesh);
  const LocalDims lv = local_dims(values.layout, values.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  GatherMap m;  // the loop runs over the values' block
  m.rank = values.layout.rank;
  for (int d = 0; d < m.rank; ++d) {
    m.extent[d] = lv.extent[d];
    m.valid[d] = lv.valid[d];
    const char c = values.layout.dims[d].label;
    const int id = idx.layout.find(c);
    if (id >= 0)
      m.a_stride[d] = li.stride[id];
    else
      m.b_stride[d] = lo.stride[out.layout.find(c)];
  }
  m.v_stride = lo.stride[0];
  m.v_offset = lo.offset[0];
  m.v_valid = lo.valid[0];
  out.data = Kokkos::View<T*>("gshard::scatter_add", static_cast<std::size_t>(lo.size));
  scatter_into<T, I>("gshard::scatter_add", m, lv.size, out.data, idx.data, values.data);
  return out;
}

}  // namespace index_ops

/// scatter_add into a zeroed `label` dimension of size n, on run-time layouts.
/// `used_indices` receives the indices in the layout the scatter used (kept for the backward).
template <class T, class I>
RuntimeTensor<T> scatter_add_runtime(char label, std::int64_t n, const MeshState& mesh,
                                     const std::vector<std::string>& names,
                                     const RuntimeTensor<T>& values,
                                     const RuntimeTensor<I>& indices,
                                     RuntimeTensor<I>* used_indices = nullptr) {
  using namespace index_ops;
  const std::string op = std::string("scatter_add<\"") + label + "\">";
  const std::string context = "values " + describe(values.layout, values.shape, names) +
                              ", indices " + describe(indices.layout, indices.shape, names) +
                              ", size " + std::to_string(n);
  if (n < 0) throw Error(op, context + ": the size must not be negative");
  if (values.layout.find(label) >= 0)
    throw Error(op, context + ": the values already have label '" + label + "'");
  for (int d = 0; d < indices.layout.rank; ++d) {
    const int vd = values.layout.find(indices.layout.dims[d].label);
    if (vd < 0)
      throw Error(op, context + ": index label '" + indices.layout.dims[d].label +
                          "' is not a label of the values");
    if (values.shape[static_cast<std::size_t>(vd)] != indices.shape[static_cast<std::size_t>(d)])
      throw Error(op, context + ": label '" + indices.layout.dims[d].label + "' has size " +
                          std::to_string(values.shape[static_cast<std::size_t>(vd)]) +
                          " in the values but " +
                          std::to_string(indices.shape[static_cast<std::size_t>(d)]) +
                          " in the indices");
  }
  if (values.partial_op != ReduceOp::sum && values.layout.partial_count > 0)
    throw Error(op, context +
                        ": the values hold pending max/min partials; finish them with "
                        "reshard first");
  const ScatterLayouts rules = scatter_layouts(values.layout, indices.layout, label);
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  check_indices(idx, n, mesh, names, op, context);
  if (used_indices) *used_indices = idx;
  return scatter_local<T, I>(label, n, DimLayout{}, mesh, values, idx);
}

/// The gradient of take<label> with respect to the table: the cotangent `g` (the take result's
/// labels) scattered back along `label`, laid out as `vdim` (the table's layout of the label in
/// the lookup: split when every rank looked up its own vocabulary shard, so the gradient lands
/// in that shard and nothing of the table's size is replicated).
template <class T, class I>
RuntimeTensor<T> take_cotangent(char label, std::int64_t n, const DimLayout& vdim,
                                const RuntimeTensor<I>& idx, const RuntimeTensor<T>& g,
                                const MeshState& mesh) {
  return index_ops::scatter_local<T, I>(label, n, vdim, mesh, g, idx);
}

/// The gradient of scatter_add<label> with respect to the values: a take of the cotangent `g`
/// ("V M...") at the same indices (no range check: the forward pass checked them).
template <class T, class I>
RuntimeTensor<T> scatter_add_cotangent(char label, const RuntimeTensor<I>& idx,
                                       const RuntimeTensor<T>& g, const MeshState& mesh,
                                       const std::vector<std::string>& names) {
  return take_runtime<T, I>(label, mesh, names, g, idx, nullptr, nullptr, false);
}

namespace index_ops {

/// A GatherMap looping over `loop` (a local block), with the strides of the same labels in the
/// indices' block (a) and in `other` (b, the table or the scatter's result), and `label`'s
/// stride, offset and valid extent in `other`.
inline GatherMap along_map(const Layout& loop, const LocalDims& ll, const Layout& idx,
                           const LocalDims& li, const Layout& other, const LocalDims& lother,
                           char label) {
  GatherMap m;
  m.rank = loop.rank;
  for (int d = 0; d < m.rank; ++d) {
    m.extent[d] = ll.extent[d];
    m.valid[d] = ll.valid[d];
    const int id = idx.find(loop.dims[d].label);
    const int od = other.find(loop.dims[d].label);
    m.a_stride[d] = id >= 0 ? li.stride[id] : 0;
    m.b_stride[d] = od >= 0 ? lother.stride[od] : 0;
  }
  const int vd = other.find(label);
  m.v_stride = lother.stride[vd];
  m.v_offset = lother.offset[vd];
  m.v_valid = lother.valid[vd];
  return m;
}

/// The local half of scatter_add_along: `values` added into a zeroed result laid out as `out`
/// (labels: `label`, of size n, and values' labels; the values' axes on the shared labels), the
/// indices already in the values' splits. Each value row goes to its index (none if negative).
template <class T, class I>
RuntimeTensor<T> scatter_along_local(char label, std::int64_t n, const Layout& out,
                                     const MeshState& mesh, const RuntimeTensor<T>& values,
                                     const RuntimeTensor<I>& idx) {
  RuntimeTensor<T> r{out, {}, {}, ReduceOp::sum};
  for (int d = 0; d < out.rank; ++d)
    r.shape.push_back(
        out.dims[d].label == label
            ? n
            : values.shape[static_cast<std::size_t>(values.layout.find(out.dims[d].label))]);
  const LocalDims lo = local_dims(r.layout, r.shape, mesh);
  const LocalDims lv = local_dims(values.layout, values.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  const GatherMap m = along_map(values.layout, lv, idx.layout, li, r.layout, lo, label);
  r.data = Kokkos::View<T*>("gshard::scatter_add_along", static_cast<std::size_t>(lo.size));
  scatter_into<T, I>("gshard::scatter_add_along", m, lv.size, r.data, idx.data, values.data);
  return r;
}

}  // namespace index_ops

/// take_along `label` on run-time layouts: check the operands, bring them to the rule's layouts
/// (detail::take_along_layouts), check the indices (unless trusted), look up locally.
/// `used_indices` receives the indices in the layout the lookup used (kept for the backward);
/// `order`, when given, orders the result's dimensions like its labels (the backward's use).
template <class T, class I>
RuntimeTensor<T> take_along_runtime(char label, const MeshState& mesh,
                                    const std::vector<std::string>& names,
                                    const RuntimeTensor<T>& table, const RuntimeTensor<I>& indices,
                                    Bounds bounds = Bounds::checked,
                                    RuntimeTensor<I>* used_indices = nullptr,
                                    const Layout* order = nullptr) {
  using namespace index_ops;
  const std::string op = std::string("take_along<\"") + label + "\">";
  const std::string context = "table " + describe(table.layout, table.shape, names) + ", indices " +
                              describe(indices.layout, indices.shape, names);
  const int vd = table.layout.find(label);
  if (vd < 0) throw Error(op, context + ": the table has no label '" + label + "'");
  if (indices.layout.find(label) >= 0)
    throw Error(op, context + ": label '" + label + "' is also a label of the indices");
  for (int d = 0; d < indices.layout.rank; ++d) {
    const char c = indices.layout.dims[d].label;
    const int td = table.layout.find(c);
    if (td >= 0 &&
        table.shape[static_cast<std::size_t>(td)] != indices.shape[static_cast<std::size_t>(d)])
      throw Error(
          op, context + ": batch label '" + c + "' has size " +
                  std::to_string(table.shape[static_cast<std::size_t>(td)]) + " in the table but " +
                  std::to_string(indices.shape[static_cast<std::size_t>(d)]) + " in the indices");
  }
  const AlongLayouts rules = take_along_layouts(table.layout, indices.layout, label);
  if (!rules.ok) throw Error(op, context + ": the result would have more than 8 labels");
  const std::int64_t n = table.shape[static_cast<std::size_t>(vd)];
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  if (bounds == Bounds::checked) check_indices(idx, n, mesh, names, op, context, true);
  if (used_indices) *used_indices = idx;
  const RuntimeTensor<T> tab = bring(table, rules.data, mesh, names, op);
  if (tab.partial_op != ReduceOp::sum && rules.output.partial_count > 0)
    throw Error(op, context +
                        ": the table holds pending max/min partials; finish them with "
                        "reshard first");
  RuntimeTensor<T> out{rules.output, idx.shape, {}, ReduceOp::sum};
  for (int d = 0; d < tab.layout.rank; ++d)
    if (d != vd && idx.layout.find(tab.layout.dims[d].label) < 0)
      out.shape.push_back(tab.shape[static_cast<std::size_t>(d)]);
  if (order) {
    const Layout l = reordered_like(out.layout, *order);
    out.shape = shape_in(l, out.layout, out.shape);
    out.layout = l;
  }
  const LocalDims lo = local_dims(out.layout, out.shape, mesh);
  const LocalDims li = local_dims(idx.layout, idx.shape, mesh);
  const LocalDims lt = local_dims(tab.layout, tab.shape, mesh);
  const GatherMap m = along_map(out.layout, lo, idx.layout, li, tab.layout, lt, label);
  out.data = gather<T, I>("gshard::take_along", m, lo.size, idx.data, tab.data);
  return out;
}

/// scatter_add_along `label` (size n) with batch labels `batch` on run-time layouts: check the
/// operands, bring the indices to the values' splits, check them (unless trusted), add locally.
template <class T, class I>
RuntimeTensor<T> scatter_add_along_runtime(char label, std::string_view batch, std::int64_t n,
                                           const MeshState& mesh,
                                           const std::vector<std::string>& names,
                                           const RuntimeTensor<T>& values,
                                           const RuntimeTensor<I>& indices,
                                           Bounds bounds = Bounds::checked,
                                           RuntimeTensor<I>* used_indices = nullptr) {
  using namespace index_ops;
  const std::string op =
      std::string("scatter_add_along<\"") + label + "\", \"" + std::string(batch) + "\">";
  const std::string context = "values " + describe(values.layout, values.shape, names) +
                              ", indices " + describe(indices.layout, indices.shape, names) +
                              ", size " + std::to_string(n);
  if (n < 0) throw Error(op, context + ": the size must not be negative");
  if (values.layout.find(label) >= 0)
    throw Error(op, context + ": the values already have label '" + label + "'");
  for (int d = 0; d < indices.layout.rank; ++d) {
    const char c = indices.layout.dims[d].label;
    const int vd = values.layout.find(c);
    if (vd < 0) throw Error(op, context + ": index label '" + c + "' is not a label of the values");
    if (values.shape[static_cast<std::size_t>(vd)] != indices.shape[static_cast<std::size_t>(d)])
      throw Error(op, context + ": label '" + c + "' has size " +
                          std::to_string(values.shape[static_cast<std::size_t>(vd)]) +
                          " in the values but " +
                          std::to_string(indices.shape[static_cast<std::size_t>(d)]) +
                          " in the indices");
  }
  for (const char c : batch)
    if (c != ' ' && indices.layout.find(c) < 0)
      throw Error(op, context + ": batch label '" + c + "' is not a label of the indices");
  if (values.partial_op != ReduceOp::sum && values.layout.partial_count > 0)
    throw Error(op, context +
                        ": the values hold pending max/min partials; finish them with "
                        "reshard first");
  const AlongLayouts rules = scatter_along_layouts(values.layout, indices.layout, label, batch);
  if (!rules.ok) throw Error(op, context + ": the result would have more than 8 labels");
  const RuntimeTensor<I> idx = bring(indices, rules.indices, mesh, names, op);
  if (bounds == Bounds::checked) check_indices(idx, n, mesh, names, op, context, true);
  if (used_indices) *used_indices = idx;
  return scatter_along_local<T, I>(label, n, rules.output, mesh, values, idx);
}

/// The gradient of take_along<label> with respect to the table (labels and order of `table`):
/// the cotangent `g` (the result's layout) scattered back at the indices the lookup used, the
/// batch labels in g's splits; pending over g's axes of the indices' other labels. Local.
template <class T, class I>
RuntimeTensor<T> take_along_cotangent(char label, std::int64_t n, const Layout& table,
                                      const RuntimeTensor<I>& idx, const RuntimeTensor<T>& g,
                                      const MeshState& mesh) {
  std::string labels;
  for (int d = 0; d < table.rank; ++d) labels += table.dims[d].label;
  const Layout out = scatter_along_layouts(g.layout, idx.layout, label, labels).output;
  return index_ops::scatter_along_local<T, I>(label, n, reordered_like(out, table), mesh, g, idx);
}

/// The gradient of scatter_add_along<label> with respect to the values (labels and order of
/// `values`): a take_along of the cotangent `g` at the same indices (already checked).
template <class T, class I>
RuntimeTensor<T> scatter_add_along_cotangent(char label, const Layout& values,
                                             const RuntimeTensor<I>& idx, const RuntimeTensor<T>& g,
                                             const MeshState& mesh,
                                             const std::vector<std::string>& names) {
  return take_along_runtime<T, I>(label, mesh, names, g, idx, Bounds::trusted, nullptr, &values);
}

template <class I>
inline constexpr bool is_index_type_v =
    std::is_same_v<I, std::int32_t> || std::is_same_v<I, std::int64_t>;

template <fixed_string Label, class Indices>
constexpr bool check_index_operands_common() {
  if constexpr (Label.size() != 1) {
    return sizeof(index_error::label_must_be_one_letter<detail::shown<Label>,
                                                        detail::shown<Indices::spec>>) == 0;
  } else if constexpr (!is_index_type_v<typename Indices::value_type>) {
    return sizeof(index_error::indices_must_be_int32_or_int64<detail::shown<Indices::spec>>) == 0;
  } else {
    return true;
  }
}

constexpr fixed_string one_letter(char c) {
  fixed_string s;
  s.data[0] = c;
  return s;
}

template <class Table, class Indices>
constexpr int first_shared_label() {
  for (int d = 0; d < Indices::layout.rank; ++d)
    if (Table::layout.find(Indices::layout.dims[d].label) >= 0) return d;
  return -1;
}

template <fixed_string Label, class Table, class Indices>
constexpr bool check_take() {
  if constexpr (!check_index_operands_common<Label, Indices>()) {
    return false;
  } else if constexpr (Table::layout.find(Label.data[0]) < 0) {
    return sizeof(index_error::indexed_label_not_in_table<detail::shown<Label>,
                                                          detail::shown<Table::spec>>) == 0;
  } else if constexpr (first_shared_label<Table, Indices>() >= 0) {
    constexpr char c = Indices::layout.dims[first_shared_label<Table, Indices>()].label;
    constexpr fixed_string l = one_letter(c);
    return sizeof(
               index_error::index_label_also_in_table<detail::shown<l>, detail::shown<Table::spec>,
                                                      detail::shown<Indices::spec>>) == 0;
  } else if constexpr (Table::layout.rank + Indices::layout.rank - 1 > max_dims) {
    return sizeof(index_error::result_has_more_than_8_labels<detail::shown<Table::spec>,
                                                             detail::shown<Indices::spec>>) == 0;
  } else {
    return true;
  }
}

template <class Values, class Indices>
constexpr int first_missing_label() {
  for (int d = 0; d < Indices::layout.rank; ++d)
    if (Values::layout.find(Indices::layout.dims[d].label) < 0) return d;
  return -1;
}

template <fixed_string Label, class Values, class Indices>
constexpr bool check_scatter() {
  if constexpr (!check_index_operands_common<Label, Indices>()) {
    return false;
  } else if constexpr (Values::layout.find(Label.data[0]) >= 0) {
    return sizeof(index_error::scattered_label_already_in_values<detail::shown<Label>,
                                                                 detail::shown<Values::spec>>) == 0;
  } else if constexpr (first_missing_label<Values, Indices>() >= 0) {
    constexpr char c = Indices::layout.dims[first_missing_label<Values, Indices>()].label;
    constexpr fixed_string l = one_letter(c);
    return sizeof(
               index_error::index_label_not_in_values<detail::shown<l>, detail::shown<Values::spec>,
                                                      detail::shown<Indices::spec>>) == 0;
  } else {
    return true;
  }
}

template <fixed_string Label, class Table, class Indices>
constexpr bool check_take_along() {
  if constexpr (!check_index_operands_common<Label, Indices>()) {
    return false;
  } else if constexpr (Table::layout.find(Label.data[0]) < 0) {
    return sizeof(index_error::along_label_not_in_table<detail::shown<Label>,
                                                        detail::shown<Table::spec>>) == 0;
  } else if constexpr (Indices::layout.find(Label.data[0]) >= 0) {
    return sizeof(index_error::along_label_in_indices<detail::shown<Label>,
                                                      detail::shown<Indices::spec>>) == 0;
  } else if constexpr (!take_along_layouts(Table::layout, Indices::layout, Label.data[0]).ok) {
    return sizeof(index_error::along_result_has_more_than_8_labels<detail::shown<Table::spec>,
                                                                   detail::shown<Indices::spec>>) ==
           0;
  } else {
    return true;
  }
}

template <fixed_string Batch, class Indices>
constexpr int first_batch_label_missing() {
  for (std::size_t i = 0; i != Batch.size(); ++i)  // != : nvcc warns on `i < 0` for an empty Batch
    if (Batch.data[i] != ' ' && Indices::layout.find(Batch.data[i]) < 0) return static_cast<int>(i);
  return -1;
}

template <fixed_string Label, fixed_string Batch, class Values, class Indices>
constexpr bool check_scatter_along() {
  if constexpr (!check_index_operands_common<Label, Indices>()) {
    return false;
  } else if constexpr (Values::layout.find(Label.data[0]) >= 0) {
    return sizeof(index_error::along_label_already_in_values<detail::shown<Label>,
                                                             detail::shown<Values::spec>>) == 0;
  } else if constexpr (first_missing_label<Values, Indices>() >= 0) {
    constexpr char c = Indices::layout.dims[first_missing_label<Values, Indices>()].label;
    constexpr fixed_string l = one_letter(c);
    return sizeof(index_error::along_index_label_not_in_values<
                  detail::shown<l>, detail::shown<Values::spec>, detail::shown<Indices::spec>>) ==
           0;
  } else if constexpr (first_batch_label_missing<Batch, Indices>() >= 0) {
    constexpr fixed_string l = one_letter(Batch.data[first_batch_label_missing<Batch, Indices>()]);
    return sizeof(
               index_error::along_batch_label_not_in_indices<detail::shown<l>, detail::shown<Batch>,
                                                             detail::shown<Indices::spec>>) == 0;
  } else if constexpr (!scatter_along_layouts(Values::layout, Indices::layout, Label.data[0],
                                              Batch.view())
                            .ok) {
    return sizeof(index_error::along_result_has_more_than_8_labels<detail::shown<Values::spec>,
                                                                   detail::shown<Indices::spec>>) ==
           0;
  } else {
    return true;
  }
}

}  // namespace detail

/// take<"V">(table, indices): table[indices[b, s...], m...] for every (b, s..., m...). Labels:
/// the indices', then the table's other labels; layout by detail::take_layouts (see the top of
/// this file). Eager; collective over the mesh (an AllReduce of 3 integers over the axes that
/// split the indices checks them; reshards when the rule needs them).
template <fixed_string Label, Expression Table, Expression Indices>
auto take(const Table& table, const Indices& indices,
          std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "take");
  if constexpr (!detail::check_take<Label, Table, Indices>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename Table::mesh_type, typename Indices::mesh_type>,
                  "gshard::take: the table and the indices must be on the same Mesh type");
    using T = typename Table::value_type;
    using MeshT = typename Table::mesh_type;
    constexpr detail::TakeLayouts L =
        detail::take_layouts(Table::layout, Indices::layout, Label.data[0]);
    static_assert(detail::strict_check<MeshT, "take", 0, Table::layout, L.table>() &&
                  detail::strict_check<MeshT, "take", 1, Indices::layout, L.indices>());
    // The engine brings both to the rule's layouts, so its messages name the layouts given.
    using I = typename Indices::value_type;
    const auto i = detail::materialise(indices);
    const auto t = detail::materialise(table);
    const MeshT& mesh = table.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::take_runtime<T>(
        Label.data[0], mesh.state(), detail::axis_name_list<MeshT>(), t, i, &L, &used);
    if constexpr (detail::differentiable_v<T>) {
      constexpr char label = Label.data[0];
      constexpr DimLayout vdim = L.table.dims[Table::layout.find(label)];
      const std::int64_t n = t.shape[static_cast<std::size_t>(t.layout.find(label))];
      detail::record(mesh, r, std::string("take<\"") + label + "\">", where, {t.grad},
                     [used, n, vdim, m = mesh](const detail::RuntimeTensor<T>& g) {
                       return detail::Cotangents{detail::AnyTensor(detail::take_cotangent<T, I>(
                           Label.data[0], n, vdim, used, g, m.state()))};
                     });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

/// The embedding lookup: take<"V">(table, ids). With the table split over V and the ids
/// replicated over V's axes, each rank looks up its vocabulary shard and the result is a pending
/// partial sum over those axes (no communication until it is finished).
template <fixed_string Label, Expression Table, Expression Indices>
auto embedding(const Table& table, const Indices& ids,
               std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "embedding");
  return take<Label>(table, ids, where);
}

/// scatter_add<"V">(values, indices, n): a zero tensor with label V of size n first, then the
/// values' labels that the indices lack; out[indices[b, s...], m...] += values[b, s..., m...].
/// The transpose of take. Layout by detail::scatter_layouts. Eager; collective over the mesh.
template <fixed_string Label, Expression Values, Expression Indices>
auto scatter_add(const Values& values, const Indices& indices, std::int64_t n,
                 std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "scatter_add");
  if constexpr (!detail::check_scatter<Label, Values, Indices>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename Values::mesh_type, typename Indices::mesh_type>,
                  "gshard::scatter_add: the values and the indices must be on the same Mesh type");
    using T = typename Values::value_type;
    using MeshT = typename Values::mesh_type;
    constexpr detail::ScatterLayouts L =
        detail::scatter_layouts(Values::layout, Indices::layout, Label.data[0]);
    static_assert(detail::strict_check<MeshT, "scatter_add", 1, Indices::layout, L.indices>());
    using I = typename Indices::value_type;
    const auto v = detail::materialise(values);
    const auto i = detail::materialise(indices);
    const MeshT& mesh = values.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::scatter_add_runtime<T>(
        Label.data[0], n, mesh.state(), detail::axis_name_list<MeshT>(), v, i, &used);
    if constexpr (detail::differentiable_v<T>) {
      constexpr char label = Label.data[0];
      detail::record(
          mesh, r, std::string("scatter_add<\"") + label + "\">", where, {v.grad},
          [used, m = mesh](const detail::RuntimeTensor<T>& g) {
            return detail::Cotangents{detail::AnyTensor(detail::scatter_add_cotangent<T, I>(
                label, used, g, m.state(), detail::axis_name_list<MeshT>()))};
          });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

/// take_along<"S">(table, indices): numpy's take_along_axis / torch.gather by labels. Labels of
/// both operands (other than S) are batch labels (same sizes); the indices may add labels.
/// Result: the indices' labels, then the table's labels other than S and the batch labels, e.g.
/// table "G S M", indices "G E C" -> "G E C M" with r[g, e, c, m] = table[g, idx[g, e, c], m];
/// a negative index gives a zero row (and no gradient). Layout by detail::take_along_layouts:
/// batch labels split alike in both and S not split -> local, no collective other than the
/// bounds check (none with Bounds::trusted). Eager; collective over the mesh.
template <fixed_string Label, Expression Table, Expression Indices>
auto take_along(const Table& table, const Indices& indices, Bounds bounds = Bounds::checked,
                std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "take_along");
  if constexpr (!detail::check_take_along<Label, Table, Indices>()) {
    return 0;
  } else {
    static_assert(std::is_same_v<typename Table::mesh_type, typename Indices::mesh_type>,
                  "gshard::take_along: the table and the indices must be on the same Mesh type");
    using T = typename Table::value_type;
    using I = typename Indices::value_type;
    using MeshT = typename Table::mesh_type;
    constexpr char label = Label.data[0];
    constexpr detail::AlongLayouts L =
        detail::take_along_layouts(Table::layout, Indices::layout, label);
    static_assert(detail::strict_check<MeshT, "take_along", 0, Table::layout, L.data>() &&
                  detail::strict_check<MeshT, "take_along", 1, Indices::layout, L.indices>());
    const auto i = detail::materialise(indices);
    const auto t = detail::materialise(table);
    const MeshT& mesh = table.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::take_along_runtime<T, I>(
        label, mesh.state(), detail::axis_name_list<MeshT>(), t, i, bounds, &used);
    if constexpr (detail::differentiable_v<T>) {
      const std::int64_t n = t.shape[static_cast<std::size_t>(t.layout.find(label))];
      detail::record(
          mesh, r, std::string("take_along<\"") + label + "\">", where, {t.grad},
          [used, n, m = mesh](const detail::RuntimeTensor<T>& g) {
            return detail::Cotangents{detail::AnyTensor(
                detail::take_along_cotangent<T, I>(label, n, Table::layout, used, g, m.state()))};
          });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

/// scatter_add_along<"S", "G">(values, indices, n): the transpose of take_along. Batch names the
/// batch labels (letters, e.g. "G" or "GH"; each a label of the indices; default none): the
/// result is the batch labels in the values' order, then S of size n, then the values' labels
/// the indices lack, e.g. values "G E C M", indices "G E C", Batch "G" -> "G S M" with
/// out[g, idx[g, e, c], m] += values[g, e, c, m]; negative indices add nothing. Layout by
/// detail::scatter_along_layouts: the values stay, the indices take their splits; pending over
/// the axes of the values' non-batch index labels. Eager; collective over the mesh.
template <fixed_string Label, fixed_string Batch = "", Expression Values, Expression Indices>
auto scatter_add_along(const Values& values, const Indices& indices, std::int64_t n,
                       Bounds bounds = Bounds::checked,
                       std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "scatter_add_along");
  if constexpr (!detail::check_scatter_along<Label, Batch, Values, Indices>()) {
    return 0;
  } else {
    static_assert(
        std::is_same_v<typename Values::mesh_type, typename Indices::mesh_type>,
        "gshard::scatter_add_along: the values and the indices must be on the same Mesh type");
    using T = typename Values::value_type;
    using I = typename Indices::value_type;
    using MeshT = typename Values::mesh_type;
    constexpr char label = Label.data[0];
    constexpr detail::AlongLayouts L =
        detail::scatter_along_layouts(Values::layout, Indices::layout, label, Batch.view());
    static_assert(
        detail::strict_check<MeshT, "scatter_add_along", 1, Indices::layout, L.indices>());
    const auto v = detail::materialise(values);
    const auto i = detail::materialise(indices);
    const MeshT& mesh = values.mesh();
    detail::RuntimeTensor<I> used;
    detail::RuntimeTensor<T> r = detail::scatter_add_along_runtime<T, I>(
        label, Batch.view(), n, mesh.state(), detail::axis_name_list<MeshT>(), v, i, bounds, &used);
    if constexpr (detail::differentiable_v<T>) {
      detail::record(
          mesh, r, std::string("scatter_add_along<\"") + label + "\">", where, {v.grad},
          [used, m = mesh](const detail::RuntimeTensor<T>& g) {
            return detail::Cotangents{detail::AnyTensor(detail::scatter_add_along_cotangent<T, I>(
                label, Values::layout, used, g, m.state(), detail::axis_name_list<MeshT>()))};
          });
    }
    return detail::sharded_from<Sharded<T, MeshT, detail::spec_of<MeshT, L.output>()>>(mesh, r);
  }
}

}  // namespace gshard
