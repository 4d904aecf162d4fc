#pragma once
// An application's own Kokkos Views as Sharded tensors and back (docs/hpc.md). adopt() aliases a
// View that already is this rank's padded, row-major block and copies it once otherwise; store()
// writes a tensor's block into the application's View. Which block is this rank's is the mesh's
// block distribution (tensor/geometry.hpp), which local_block() tells the application.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <type_traits>

#include "../comm/agree.hpp"
#include "../core/diagnostics.hpp"
#include "../core/error.hpp"
#include "../core/trace.hpp"
#include "../kernels/copy_box.hpp"
#include "geometry.hpp"
#include "sharded.hpp"

namespace gshard {

namespace adopt_error {
template <class>
inline constexpr bool always_false = false;
/// ViewRank: the View's rank; SpecRank: the spec's number of dimensions.
template <int ViewRank, int SpecRank>
struct view_rank_differs_from_spec {
  static_assert(always_false<view_rank_differs_from_spec>,
                "gshard::adopt/store: the View must have one dimension per label of the spec "
                "(the View's rank, the spec's)");
};
/// ViewValue: the View's element type; T: the tensor's.
template <class ViewValue, class T>
struct view_element_type_differs {
  static_assert(always_false<view_element_type_differs>,
                "gshard::adopt/store: the View's element type must be the tensor's (the View's, "
                "the tensor's); convert it in the application first");
};
template <class View>
struct store_into_const_view {
  static_assert(always_false<store_into_const_view>,
                "gshard::store: the destination View has a const element type");
};
/// Spec: the tensor's spec.
template <auto Spec>
struct store_needs_finished_partial_sums {
  static_assert(always_false<store_needs_finished_partial_sums>,
                "gshard::store: the tensor holds pending partial sums ('+axis'); reshard it to a "
                "layout without them first, so each rank's block is the value");
};
}  // namespace adopt_error

/// This rank's block of a tensor: the global index of its first element, how many elements it
/// holds per dimension (the extents adopt() wants the application's View to have), and the padded
/// extents every rank stores.
struct LocalBlock {
  Shape offsets;
  Shape extents;
  Shape padded;
};

/// The block of a tensor of type S and global shape `global_shape` on this rank of `mesh`.
template <class S>
LocalBlock local_block(const typename S::mesh_type& mesh, const Shape& global_shape) {
  if (static_cast<int>(global_shape.size()) != S::rank)
    throw Error("local_block", "spec \"" + std::string(S::spec_string()) + "\" has " +
                                   std::to_string(S::rank) + " dimensions but the global shape " +
                                   detail::shape_string(global_shape) + " has " +
                                   std::to_string(global_shape.size()));
  LocalBlock b;
  b.padded = detail::local_extents(S::layout, global_shape, mesh.sizes());
  for (int d = 0; d < S::rank; ++d) {
    const detail::Block k =
        detail::block_of(S::layout.dims[d], global_shape[static_cast<std::size_t>(d)], mesh.sizes(),
                         mesh.coordinates());
    b.offsets.push_back(k.offset);
    b.extents.push_back(k.valid);
  }
  return b;
}

struct AdoptOptions {
  /// false: where the View cannot be aliased, adopt() throws (naming why) instead of copying.
  bool allow_copy = true;
};

namespace detail {

template <class View>
std::string view_layout_name() {
  using L = typename View::array_layout;
  if constexpr (std::is_same_v<L, Kokkos::LayoutRight>) return "LayoutRight";
  if constexpr (std::is_same_v<L, Kokkos::LayoutLeft>) return "LayoutLeft";
  if constexpr (std::is_same_v<L, Kokkos::LayoutStride>) return "LayoutStride";
  return "a custom layout";
}

template <class View>
Shape view_extents(const View& v) {
  Shape e;
  for (int d = 0; d < static_cast<int>(View::rank); ++d)
    e.push_back(static_cast<std::int64_t>(v.extent(static_cast<std::size_t>(d))));
  return e;
}

template <class View>
Shape view_strides(const View& v) {
  Shape s;
  for (int d = 0; d < static_cast<int>(View::rank); ++d)
    s.push_back(static_cast<std::int64_t>(v.stride(d)));
  return s;
}

/// "LayoutLeft View of extents [5, 7], strides [1, 5]"
template <class View>
std::string describe_view(const View& v) {
  return view_layout_name<View>() + " View of extents " + shape_string(view_extents(v)) +
         ", strides " + shape_string(view_strides(v));
}

/// Whether a View's memory is a flat row-major array of extents `padded` in the tensor's memory
/// space, so the tensor can use it as its shard. Empty when yes, else why not.
template <class T, class View>
std::string alias_refusal(const View& v, const Shape& padded) {
  using Space = typename Kokkos::View<T*>::memory_space;
  if constexpr (!std::is_same_v<typename View::memory_space, Space>) {
    return "the View is in memory space " + std::string(View::memory_space::name()) +
           ", the tensor's shard in " + Space::name();
  } else if constexpr (std::is_const_v<typename View::value_type>) {
    return "the View is const and a shard may be updated in place";
  } else {
    if (view_extents(v) != padded)
      return "the View's extents " + shape_string(view_extents(v)) + " are not the padded block " +
             shape_string(padded) + " every rank stores (an uneven split pads the last blocks)";
    std::int64_t expect = 1;
    for (int d = static_cast<int>(View::rank) - 1; d >= 0; --d) {
      const auto n = padded[static_cast<std::size_t>(d)];
      if (n > 1 && static_cast<std::int64_t>(v.stride(d)) != expect)
        return "its strides " + shape_string(view_strides(v)) +
               " are not row-major in the spec's dimension order";
      expect *= n;
    }
    return {};
  }
}

/// A box copy of `extents` elements between a flat row-major padded block and a View's own
/// strides, starting at `view_start` in every dimension of the View (a halo's width, or 0).
inline BoxCopy block_box(const Shape& extents, const Shape& padded, const Shape& view_strides,
                         bool into_view, std::int64_t view_start = 0) {
  BoxCopy c;
  c.rank = static_cast<int>(extents.size());
  std::int64_t flat[max_dims]{};
  row_major_strides(c.rank, padded.data(), flat);
  for (int d = 0; d < c.rank; ++d) {
    const auto u = static_cast<std::size_t>(d);
    c.box[d] = extents[u];
    c.src_stride[d] = into_view ? flat[d] : view_strides[u];
    c.dst_stride[d] = into_view ? view_strides[u] : flat[d];
    (into_view ? c.dst_start : c.src_start)[d] = view_start;
  }
  return c;
}

/// A LayoutRight of a View's extents (unused dimensions left unset, as Kokkos wants them).
template <class View>
Kokkos::LayoutRight layout_right_of(const View& v) {
  Kokkos::LayoutRight layout;
  for (std::size_t d = 0; d < View::rank; ++d) layout.dimension[d] = v.extent(d);
  return layout;
}

/// The View itself when the default execution space can read it, else a LayoutRight copy of it
/// in the default memory space.
template <class View>
auto device_readable(const View& v) {
  using Exec = Kokkos::DefaultExecutionSpace;
  if constexpr (Kokkos::SpaceAccessibility<Exec, typename View::memory_space>::accessible) {
    return v;
  } else {
    // Packed in the View's own space first: Kokkos copies across spaces only contiguous Views.
    Kokkos::View<typename View::non_const_data_type, Kokkos::LayoutRight,
                 typename View::memory_space>
        packed(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gshard::adopt staging"),
               layout_right_of(v));
    Kokkos::deep_copy(packed, v);
    return Kokkos::create_mirror_view_and_copy(Exec::memory_space(), packed);
  }
}

/// Whether a View of this type can hold a block of S; a named diagnostic when not.
template <class S, class View>
constexpr bool view_type_fits() {
  using T = typename S::value_type;
  if constexpr (static_cast<int>(View::rank) != S::rank) {
    return sizeof(
               adopt_error::view_rank_differs_from_spec<static_cast<int>(View::rank), S::rank>) ==
           0;
  } else if constexpr (!std::is_same_v<typename View::non_const_value_type, T>) {
    return sizeof(adopt_error::view_element_type_differs<typename View::non_const_value_type, T>) ==
           0;
  } else {
    return true;
  }
}

template <class S, class View>
S adopt_local(const typename S::mesh_type& mesh, Shape global_shape, const View& local,
              AdoptOptions options) {
  if constexpr (!view_type_fits<S, View>()) {
    return S(mesh, std::move(global_shape));
  } else {
    using T = typename S::value_type;
    const gshard::LocalBlock block = local_block<S>(mesh, global_shape);
    const std::string refusal = alias_refusal<T>(local, block.padded);
    agree_on(mesh.comm(), "adopt", [&] {
      if (view_extents(local) != block.extents)
        throw Error("adopt", "on rank " + std::to_string(mesh.rank()) + " of " + mesh.describe() +
                                 " the block of \"" + std::string(S::spec_string()) +
                                 "\" with global shape " + shape_string(global_shape) +
                                 " starts at " + shape_string(block.offsets) + " and has extents " +
                                 shape_string(block.extents) + ", but the application's " +
                                 describe_view(local) + " (see gshard::local_block)");
      if (!refusal.empty() && !options.allow_copy)
        throw Error("adopt", "the application's " + describe_view(local) + " on rank " +
                                 std::to_string(mesh.rank()) + " cannot be the shard of \"" +
                                 std::string(S::spec_string()) + "\" without a copy: " + refusal +
                                 "; AdoptOptions{.allow_copy = false} forbids the copy");
    });
    if constexpr (std::is_same_v<typename View::memory_space,
                                 typename S::view_type::memory_space> &&
                  !std::is_const_v<typename View::value_type>) {
      if (refusal.empty()) {
        S out(mesh, std::move(global_shape),
              typename S::view_type(local.data(), static_cast<std::size_t>(product(block.padded))));
        // The shard is the application's memory: it lives while any handle to it does.
        ShardedAccess::version(out)->storage = std::make_shared<View>(local);
        return out;
      }
    }
    TraceSpan span("kernel", "adopt copy");
    if (span.on()) span.set_detail(describe_view(local) + " copied: " + refusal);
    S out(mesh, std::move(global_shape));
    const auto readable = device_readable(local);
    copy_box(readable.data(), out.local_view().data(),
             block_box(block.extents, block.padded, view_strides(readable), false));
    return out;
  }
}

template <class T, class MeshT, fixed_string Spec, class View>
void store_local(const Sharded<T, MeshT, Spec>& tensor, const View& local) {
  using S = Sharded<T, MeshT, Spec>;
  if constexpr (!view_type_fits<S, View>()) {
    return;
  } else if constexpr (std::is_const_v<typename View::value_type>) {
    static_assert(sizeof(adopt_error::store_into_const_view<View>) == 0);
  } else if constexpr (S::layout.partial_count > 0) {
    static_assert(sizeof(adopt_error::store_needs_finished_partial_sums<shown<Spec>>) == 0);
  } else {
    const gshard::LocalBlock block = local_block<S>(tensor.mesh(), tensor.shape());
    agree_on(tensor.mesh().comm(), "store", [&] {
      if (view_extents(local) != block.extents)
        throw Error("store", "on rank " + std::to_string(tensor.mesh().rank()) + " of " +
                                 tensor.mesh().describe() + " the block of " + tensor.describe() +
                                 " starts at " + shape_string(block.offsets) + " and has extents " +
                                 shape_string(block.extents) + ", but the application's " +
                                 describe_view(local) + " (see gshard::local_block)");
    });
    if (static_cast<const void*>(local.data()) ==
            static_cast<const void*>(tensor.local_view().data()) &&
        alias_refusal<T>(local, block.padded).empty())
      return;  // the tensor's shard is this View (adopted): already there
    TraceSpan span("kernel", "store copy");
    if (span.on()) span.set_detail(tensor.describe() + " into " + describe_view(local));
    using Exec = Kokkos::DefaultExecutionSpace;
    if constexpr (Kokkos::SpaceAccessibility<Exec, typename View::memory_space>::accessible) {
      copy_box(tensor.local_view().data(), local.data(),
               block_box(block.extents, block.padded, view_strides(local), true));
    } else {
      Kokkos::View<typename View::non_const_data_type, Kokkos::LayoutRight, Exec::memory_space>
          packed(Kokkos::view_alloc(Kokkos::WithoutInitializing, "gshard::store staging"),
                 layout_right_of(local));
      copy_box(tensor.local_view().data(), packed.data(),
               block_box(block.extents, block.padded, view_strides(packed), true));
      auto staged = Kokkos::create_mirror_view_and_copy(typename View::memory_space(), packed);
      Kokkos::deep_copy(local, staged);
    }
    // The application reads its View with its own execution space instance, or on the host.
    Exec().fence();
  }
}

}  // namespace detail

/// The application's View `local` (this rank's block: gshard::local_block) as a tensor of type S
/// and global shape `global_shape`. Without a copy when the View is this rank's padded block,
/// row-major in the spec's dimension order, in the tensor's memory space, non-const; otherwise
/// copied once (a "adopt copy" trace event says why; gshard::aliases tells afterwards;
/// AdoptOptions{.allow_copy = false} makes it an error). An aliased shard keeps the View alive
/// and shares its memory: the application's writes show in the tensor (call mark_modified).
/// The application must have finished writing the View (fenced its execution space instance, or
/// pass the instance first). Collective over the mesh (ranks agree on errors).
template <class S, class View>
requires Kokkos::is_view<View>::value S
adopt(const typename S::mesh_type& mesh, Shape global_shape, const View& local,
      AdoptOptions options = {}, std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "adopt");
  return detail::adopt_local<S>(mesh, std::move(global_shape), local, options);
}

/// adopt() after fencing the application's execution space instance `app` (its stream on a GPU).
template <class S, class ExecSpace, class View>
requires(Kokkos::is_execution_space<ExecSpace>::value&& Kokkos::is_view<View>::value) S
    adopt(const ExecSpace& app, const typename S::mesh_type& mesh, Shape global_shape,
          const View& local, AdoptOptions options = {},
          std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "adopt");
  app.fence();
  return detail::adopt_local<S>(mesh, std::move(global_shape), local, options);
}

/// Writes this rank's block of `tensor` into the application's View `local` (extents:
/// gshard::local_block): nothing to do when the tensor's shard is that View (adopted and updated
/// in place), else one copy ("store copy" in a trace). Finished (fenced) on return, so the
/// application may read it on any instance. Collective over the mesh (ranks agree on errors).
template <class T, class MeshT, fixed_string Spec, class View>
requires Kokkos::is_view<View>::value void store(
    const Sharded<T, MeshT, Spec>& tensor, const View& local,
    std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "store");
  detail::store_local(tensor, local);
}

/// Whether `tensor`'s local shard is the memory of `local` (adopt() aliased it).
template <class T, class MeshT, fixed_string Spec, class View>
requires Kokkos::is_view<View>::value bool aliases(const Sharded<T, MeshT, Spec>& tensor,
                                                   const View& local) noexcept {
  return static_cast<const void*>(tensor.local_view().data()) ==
             static_cast<const void*>(local.data()) &&
         tensor.local_size() > 0;
}

}  // namespace gshard
