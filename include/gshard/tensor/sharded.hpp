#pragma once
// gshard::Sharded<T, Mesh, "spec">: a global tensor, laid out over a mesh as its spec says.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/diagnostics.hpp"
#include "../core/error.hpp"
#include "../core/layout.hpp"
#include "../core/operators.hpp"
#include "../mesh/mesh.hpp"
#include "geometry.hpp"
#include "graph.hpp"
#include "local_index.hpp"

namespace gshard {

using ReduceOp = detail::ReduceOp;

template <class T>
concept ElementType = std::is_same_v<T, float> || std::is_same_v<T, double> ||
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t>;

namespace detail {

/// The same labels, each once, in both layouts (order may differ).
constexpr bool same_label_set(const Layout& a, const Layout& b) {
  if (a.rank != b.rank) return false;
  for (int d = 0; d < a.rank; ++d)
    if (b.find(a.dims[d].label) < 0) return false;
  return true;
}

/// Going from `from` to `to` moves no data between ranks: every dimension keeps its split or
/// was replicated (a local slice), and no pending partial sum is finished.
constexpr bool no_communication(const Layout& from, const Layout& to) {
  for (int i = 0; i < from.partial_count; ++i)
    if (!to.is_partial(from.partial[i])) return false;
  for (int d = 0; d < from.rank; ++d) {
    const int t = to.find(from.dims[d].label);
    if (t < 0) return false;
    if (from.dims[d].split() && !(from.dims[d] == to.dims[t])) return false;
  }
  return true;
}

struct ShardedAccess;

/// Records an in-place update by `op`, at the user's line now set (core/error.hpp UserSite).
inline void bump_version(ShardVersion& v, const char* op) noexcept {
  ++v.count;
  v.op = op;
  v.site = user_site_state();
}

}  // namespace detail

namespace layout_error {
template <class>
inline constexpr bool always_false = false;
template <auto From, auto To>
struct labels_differ_between_layouts {
  static_assert(always_false<labels_differ_between_layouts>,
                "gshard: a value can only be resharded to a layout with the same labels (the same "
                "number of dimensions, the same letters); "
                "to mean other labels, rename them with .as<\"...\">() first");
};
template <auto From, auto To>
struct renamed_layout_must_keep_axes {
  static_assert(always_false<renamed_layout_must_keep_axes>,
                "gshard: .as<\"...\">() renames labels only: give one new label per dimension, or "
                "the same spec with other labels");
};
/// From, To: the two specs.
template <auto From, auto To>
struct conversion_communicates_write_reshard {
  static_assert(always_false<conversion_communicates_write_reshard>,
                "gshard: this conversion between layouts moves data between ranks (a collective: "
                "every rank must make it); conversions never hide one, so write "
                "gshard::reshard<Target>(x) (or reshard_into) where you mean it");
};
}  // namespace layout_error

template <class T, class MeshT, fixed_string Spec>
class Sharded;

template <class Target, class T, class MeshT, fixed_string Spec>
Target reshard(const Sharded<T, MeshT, Spec>& source,
               std::source_location where = std::source_location::current());

template <class Target, bool Explicit, class E>
Target evaluate_at(const E& e, std::source_location where, const char* op);  // expr/node.hpp

/// A global tensor of element type T over a Mesh, laid out as Spec says (core/layout.hpp).
///
/// Handle semantics, like Kokkos::View: copies are cheap and share the local shard; use
/// clone() for a deep copy. The local shard is a flat, row-major Kokkos::View in the default
/// memory space holding the padded block (tensor/geometry.hpp); padding holds zeros.
template <class T, class MeshT, fixed_string Spec>
class Sharded {
  static_assert(ElementType<T>,
                "gshard::Sharded: element type must be float, double, int32_t or int64_t");
  static_assert(detail::check_spec<MeshT, Spec>());

 public:
  using value_type = T;
  using mesh_type = MeshT;
  using view_type = Kokkos::View<T*>;
  static constexpr auto spec = Spec;
  static constexpr Layout layout = parse_layout(Spec.view(), MeshT::axis_names).layout;
  static constexpr int rank = layout.rank;
  static constexpr bool is_gshard_expression = true;
  static constexpr bool is_lazy = false;

  /// A zero-filled tensor of the given global shape (labels in spec order).
  Sharded(const MeshT& mesh, Shape global_shape,
          std::source_location where = std::source_location::current())
      : mesh_(mesh), shape_(std::move(global_shape)) {
    const detail::UserSite site(where, "Sharded");
    check_shape("Sharded");
    data_ = view_type("gshard::Sharded", local_size());
  }

  /// Wraps a user's View as the local shard, zero-copy. It must hold exactly the padded local
  /// block (local_shape()), row-major.
  Sharded(const MeshT& mesh, Shape global_shape, view_type local,
          std::source_location where = std::source_location::current())
      : mesh_(mesh), shape_(std::move(global_shape)), data_(std::move(local)) {
    const detail::UserSite site(where, "Sharded");
    check_shape("Sharded");
    if (static_cast<std::int64_t>(data_.extent(0)) != local_size())
      throw Error("Sharded", "a View of " + std::to_string(data_.extent(0)) +
                                 " elements cannot be the local shard of \"" +
                                 std::string(Spec.view()) + "\" with global shape " +
                                 detail::shape_string(shape_) + ": the padded local block holds " +
                                 std::to_string(local_size()));
  }

  /// A layout change that moves no data between ranks (a local slice of a replicated dimension,
  /// a transpose) converts implicitly.
  template <fixed_string OtherSpec>
  requires(!(OtherSpec == Spec) &&
           detail::no_communication(Sharded<T, MeshT, OtherSpec>::layout, layout))
      Sharded(const Sharded<T, MeshT, OtherSpec>& other,  // NOLINT: implicit on purpose
              std::source_location where = std::source_location::current())
      : Sharded(reshard<Sharded>(other, where)) {}

  /// A fresh value (an op's result) given a declared layout: the annotation reshards it, as
  /// evaluating an expression does (expr/node.hpp evaluate_at); the trace shows the collective at
  /// `where`. Under GSHARD_STRICT it must be written reshard<Target>(...) when it communicates.
  template <fixed_string OtherSpec>
  requires(!(OtherSpec == Spec) &&
           !detail::no_communication(Sharded<T, MeshT, OtherSpec>::layout, layout) &&
           detail::same_label_set(Sharded<T, MeshT, OtherSpec>::layout, layout))
      Sharded(Sharded<T, MeshT, OtherSpec>&& fresh,  // NOLINT: implicit on purpose
              std::source_location where = std::source_location::current())
      : Sharded(annotated(fresh, where)) {}

  /// An existing tensor never changes layout implicitly when that communicates: a collective is
  /// written reshard<Target>(x), so every rank's call is visible (docs/design.md, "Conversions").
  template <fixed_string OtherSpec>
  requires(!(OtherSpec == Spec) &&
           !detail::no_communication(Sharded<T, MeshT, OtherSpec>::layout, layout))
      Sharded(const Sharded<T, MeshT, OtherSpec>& other,  // NOLINT: diagnosed
              std::source_location where = std::source_location::current())
      : Sharded(other.mesh(), {}, where) {
    if constexpr (!detail::same_label_set(Sharded<T, MeshT, OtherSpec>::layout, layout)) {
      static_assert(sizeof(layout_error::labels_differ_between_layouts<detail::shown<OtherSpec>,
                                                                       detail::shown<Spec>>) == 0);
    } else {
      static_assert(
          sizeof(layout_error::conversion_communicates_write_reshard<detail::shown<OtherSpec>,
                                                                     detail::shown<Spec>>) == 0);
    }
  }

  /// Evaluating a lazy expression (einsum, elementwise ops) into this layout: an annotation, so
  /// the value is resharded when the expression's own layout differs.
  template <Expression E>
  requires(E::is_lazy) Sharded(const E& e,  // NOLINT: implicit on purpose
                               std::source_location where = std::source_location::current())
      : Sharded(evaluate_at<Sharded, false>(e, where, "Sharded")) {}

  GSHARD_EXPRESSION_OPERATORS(Sharded)

  [[nodiscard]] const MeshT& mesh() const noexcept { return mesh_; }
  [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
  [[nodiscard]] std::int64_t size() const noexcept { return detail::product(shape_); }
  /// How pending partial sums combine (sum unless a max/min reduction produced them).
  [[nodiscard]] ReduceOp partial_op() const noexcept { return partial_op_; }

  /// The autodiff node that made this value (null: not tracked; see gshard::track).
  [[nodiscard]] const std::shared_ptr<detail::GradNode>& grad_node() const noexcept {
    return node_;
  }
  /// Whether gradients flow to or through this value.
  [[nodiscard]] bool tracked() const noexcept { return node_ != nullptr; }

  /// The padded local block, flat and row-major in spec order. Writing to it updates every
  /// handle; call mark_modified() afterwards so lazy expressions built over the old value refuse
  /// to run instead of reading the new one.
  [[nodiscard]] const view_type& local_view() const noexcept { return data_; }
  /// How many in-place updates this shard had (optimizer steps, reshard_into, mark_modified).
  [[nodiscard]] std::uint64_t version() const noexcept { return version_->count; }
  /// Records an in-place update of the shard made through local_view().
  void mark_modified(std::source_location where = std::source_location::current()) const noexcept {
    const detail::UserSite site(where);
    detail::bump_version(*version_, "mark_modified");
  }
  /// Padded local extent of each dimension (equal on every rank).
  [[nodiscard]] Shape local_shape() const {
    return detail::local_extents(layout, shape_, mesh_.sizes());
  }
  [[nodiscard]] std::int64_t local_size() const { return detail::product(local_shape()); }
  /// Global index of this rank's first element along each dimension.
  [[nodiscard]] Shape global_offsets() const { return block_field(&detail::Block::offset); }
  /// How many of this rank's elements along each dimension are real (the rest is padding).
  [[nodiscard]] Shape valid_extents() const { return block_field(&detail::Block::valid); }

  /// The spec, e.g. "G:data S M".
  [[nodiscard]] static constexpr std::string_view spec_string() { return Spec.view(); }
  [[nodiscard]] std::string describe() const {
    return "Sharded<\"" + std::string(Spec.view()) + "\"> of shape " + detail::shape_string(shape_);
  }

  /// A deep copy.
  [[nodiscard]] Sharded clone() const {
    Sharded out(mesh_, shape_);
    Kokkos::deep_copy(out.data_, data_);
    out.partial_op_ = partial_op_;
    out.node_ = node_;  // the same value: gradients flow through a copy as through the original
    return out;
  }

  /// The same data under other labels, without a copy: either one new label per dimension
  /// ("ABC"), or the whole spec with other labels and the same axes ("A:data B C").
  template <fixed_string NewSpec>
  [[nodiscard]] auto as() const {
    constexpr bool labels_only = [] {
      for (char c : NewSpec.view())
        if (c == ':' || c == '+' || c == ' ') return false;
      return true;
    }();
    if constexpr (labels_only) {
      if constexpr (NewSpec.size() != static_cast<std::size_t>(rank)) {
        static_assert(NewSpec.size() == static_cast<std::size_t>(rank),
                      "gshard .as<\"...\">(): give one new label per dimension");
        return *this;
      } else {
        return as<relabelled<NewSpec>()>();
      }
    } else {
      using Result = Sharded<T, MeshT, NewSpec>;
      if constexpr (!same_axes_as(Result::layout)) {
        static_assert(sizeof(layout_error::renamed_layout_must_keep_axes<detail::shown<Spec>,
                                                                         detail::shown<NewSpec>>) ==
                      0);
        return *this;
      } else {
        Result out(mesh_, shape_, data_);
        out.partial_op_ = partial_op_;
        out.node_ = detail::relabel_node<T>(mesh_, node_, layout, Result::layout, shape_);
        out.version_ = version_;  // the same shard
        return out;
      }
    }
  }

  /// The whole tensor, row-major in spec order, on every rank (partial sums reduced).
  /// Collective over the mesh.
  [[nodiscard]] std::vector<T> to_global(
      std::source_location where = std::source_location::current()) const {
    const detail::UserSite site(where, "to_global");
    return assemble(/*root=*/-1);
  }
  /// The whole tensor on `root` only (an empty vector elsewhere). Collective over the mesh.
  [[nodiscard]] std::vector<T> gather_to_root(
      int root = 0, std::source_location where = std::source_location::current()) const {
    const detail::UserSite site(where, "gather_to_root");
    if (root < 0 || root >= mesh_.size())
      throw Error("gather_to_root", "root " + std::to_string(root) +
                                        " is not a rank of the mesh (" +
                                        std::to_string(mesh_.size()) + " ranks)");
    return assemble(root);
  }

 private:
  // Same axes per position and same partial axes: only the labels may differ.
  static constexpr bool same_axes_as(const Layout& to) {
    if (to.rank != layout.rank || to.partial_count != layout.partial_count) return false;
    for (int d = 0; d < layout.rank; ++d) {
      DimLayout a = layout.dims[d];
      DimLayout b = to.dims[d];
      a.label = b.label = 0;
      if (!(a == b)) return false;
    }
    for (int i = 0; i < layout.partial_count; ++i)
      if (!to.is_partial(layout.partial[i])) return false;
    return true;
  }

  template <fixed_string OtherSpec>
  static Sharded annotated(const Sharded<T, MeshT, OtherSpec>& fresh, std::source_location where) {
    if constexpr (strict_mode) {
      static_assert(
          sizeof(strict_error::evaluation_into_layout_communicates<detail::shown<OtherSpec>,
                                                                   detail::shown<Spec>>) == 0);
    }
    const detail::UserSite site(where, "Sharded");
    return reshard<Sharded>(fresh, where);
  }

  template <fixed_string NewLabels>
  static constexpr auto relabelled() {
    // Spec with each label replaced in turn by the next new label.
    constexpr std::size_t n = Spec.size() + 1;
    fixed_string out = Spec;
    std::size_t next = 0;
    bool at_piece_start = true;
    for (std::size_t i = 0; i + 1 < n; ++i) {
      const char c = out.data[i];
      if (c == ' ') {
        at_piece_start = true;
        continue;
      }
      if (at_piece_start && c != '+') out.data[i] = NewLabels.data[next++];
      at_piece_start = false;
    }
    return out;
  }

  void check_shape(const char* op) const {
    if (static_cast<int>(shape_.size()) != rank)
      throw Error(op, "spec \"" + std::string(Spec.view()) + "\" has " + std::to_string(rank) +
                          " dimensions but the global shape " + detail::shape_string(shape_) +
                          " has " + std::to_string(shape_.size()));
    for (auto n : shape_)
      if (n < 0)
        throw Error(op, "global shape " + detail::shape_string(shape_) + " of \"" +
                            std::string(Spec.view()) + "\" has a negative size");
  }

  Shape block_field(std::int64_t detail::Block::*field) const {
    Shape out(static_cast<std::size_t>(rank));
    for (int d = 0; d < rank; ++d)
      out[static_cast<std::size_t>(d)] =
          detail::block_of(layout.dims[d], shape_[static_cast<std::size_t>(d)], mesh_.sizes(),
                           mesh_.coordinates()).*
          field;
    return out;
  }

  // Every rank's padded block (all equal in size) gathered, then placed by its coordinates;
  // copies over replicated axes are read once, copies over partial axes are combined.
  std::vector<T> assemble(int root) const {
    const std::int64_t n = local_size();
    auto host = Kokkos::create_mirror_view(data_);
    Kokkos::deep_copy(host, data_);
    const int ranks = mesh_.size();
    std::vector<T> all(static_cast<std::size_t>(root < 0 || root == mesh_.rank() ? n * ranks : 0));
    if (root < 0) {
      detail::all_gather(host.data(), all.data(), n, mesh_.comm(), "all");
    } else {
      const gshard::detail::CollectiveWatch watch("Gather", "all", mesh_.comm());
      MPI_Gather(host.data(), detail::mpi_count(n, "gather_to_root"), detail::mpi_type<T>(),
                 all.data(), detail::mpi_count(n, "gather_to_root"), detail::mpi_type<T>(), root,
                 mesh_.comm());
      if (root != mesh_.rank()) return {};
    }
    std::vector<T> global(static_cast<std::size_t>(size()), T{});
    for (int r = 0; r < ranks; ++r) {
      const Coords c = mesh_.coordinates_of(r);
      // Copies over axes that neither split nor hold partial sums: read the one at 0.
      bool duplicate = false;
      for (int a = 0; a < MeshT::axis_count; ++a)
        if (layout.dim_on_axis(a) < 0 && !layout.is_partial(a) &&
            c[static_cast<std::size_t>(a)] != 0)
          duplicate = true;
      if (duplicate) continue;
      detail::BlockIndex b = detail::block_index(layout, shape_, mesh_.sizes(), c);
      b.holds_values = true;
      const T* block = all.data() + static_cast<std::size_t>(r) * static_cast<std::size_t>(n);
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t g = b.global_of(i);
        if (g < 0) continue;
        const auto gu = static_cast<std::size_t>(g);
        if (layout.partial_count == 0) {
          global[gu] = block[i];
        } else {
          // Row-major order visits the copy at partial coordinate 0 before the others.
          global[gu] = combine(global[gu], block[i], first_partial_copy(c));
        }
      }
    }
    return global;
  }
  // The first copy along the partial axes initialises, the others combine.
  static bool first_partial_copy(const Coords& c) {
    for (int i = 0; i < layout.partial_count; ++i)
      if (c[static_cast<std::size_t>(layout.partial[i])] != 0) return false;
    return true;
  }
  T combine(T acc, T value, bool first) const {
    if (first) return value;
    switch (partial_op_) {
      case ReduceOp::sum:
        return acc + value;
      case ReduceOp::max:
        return value > acc ? value : acc;
      case ReduceOp::min:
        return value < acc ? value : acc;
    }
    return acc;
  }

  MeshT mesh_;
  Shape shape_;
  view_type data_;
  ReduceOp partial_op_ = ReduceOp::sum;
  std::shared_ptr<detail::GradNode> node_;
  std::shared_ptr<detail::ShardVersion> version_ = std::make_shared<detail::ShardVersion>();

  template <class, class, fixed_string>
  friend class Sharded;
  friend struct detail::ShardedAccess;
};

namespace detail {

/// The library's access to a Sharded's internals (not part of the public surface).
struct ShardedAccess {
  template <class S>
  static void set_partial_op(S& t, ReduceOp op) noexcept {
    t.partial_op_ = op;
  }
  template <class S>
  static void set_grad_node(S& t, std::shared_ptr<GradNode> n) noexcept {
    t.node_ = std::move(n);
  }
  template <class S>
  static const std::shared_ptr<ShardVersion>& version(const S& t) noexcept {
    return t.version_;
  }
  template <class S>
  static void share_version(S& t, std::shared_ptr<ShardVersion> v) noexcept {
    if (v) t.version_ = std::move(v);
  }
};

template <class T, class MeshT, fixed_string Spec>
void set_partial_op(Sharded<T, MeshT, Spec>& t, ReduceOp op) noexcept {
  ShardedAccess::set_partial_op(t, op);
}
template <class T, class MeshT, fixed_string Spec>
void set_grad_node(Sharded<T, MeshT, Spec>& t, std::shared_ptr<GradNode> n) noexcept {
  ShardedAccess::set_grad_node(t, std::move(n));
}
/// Records that `op` (at the user's line now set) changed the shard of `t` in place.
template <class T, class MeshT, fixed_string Spec>
void mark_updated(const Sharded<T, MeshT, Spec>& t, const char* op) noexcept {
  bump_version(*ShardedAccess::version(t), op);
}

}  // namespace detail

}  // namespace gshard
