#pragma once
// The partition rules of take, scatter_add, take_along and scatter_add_along (constexpr: the
// typed API applies them at compile time, the run-time engine the same functions), their
// compile-time errors and the checks of the typed API (ops/index.hpp).
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "../../expr/node.hpp"
#include "../../tensor/sharded.hpp"

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
}  // namespace gshard
