#pragma once
// gshard::HaloField<S>: a rank's block of a tensor of layout S with ghost cells around it, for
// stencil codes (docs/hpc.md). The block stays in one persistent View across sweeps; exchange()
// refreshes the ghost cells from the neighbouring blocks (one MPI_Sendrecv per side per split
// dimension, only the border moves, buffers made once); ghost cells past the global edge hold a
// fixed edge value. The application's own kernels read and write view().
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <array>
#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>

#include "../comm/agree.hpp"
#include "../comm/collectives.hpp"
#include "../comm/mpi_access.hpp"
#include "../core/error.hpp"
#include "../kernels/copy_box.hpp"
#include "../tensor/adopt.hpp"
#include "../tensor/geometry.hpp"
#include "../tensor/sharded.hpp"
#include "halo.hpp"
#include "plan.hpp"

namespace gshard {

struct HaloOptions {
  /// Ghost cells on each side of every dimension.
  std::int64_t width = 1;
  /// Also fill the corner (and edge, in 3-D) ghost cells, as 9- or 27-point stencils need: the
  /// exchange then sends each dimension's border across the ghost cells of the others. Without,
  /// only faces move (a 5- or 7-point stencil), the bytes a hand-written exchange sends.
  bool corners = false;
};

namespace detail {

template <class T, int Rank>
struct halo_data {
  using type = typename halo_data<T, Rank - 1>::type*;
};
template <class T>
struct halo_data<T, 0> {
  using type = T;
};

}  // namespace detail

template <class S>
class HaloField {
  static_assert(S::rank >= 1 && S::rank <= 3,
                "gshard::HaloField: one to three dimensions (a stencil's grid)");
  static_assert(S::layout.partial_count == 0,
                "gshard::HaloField: a layout with pending partial sums (+axis) has no values to "
                "exchange");

 public:
  using value_type = typename S::value_type;
  using mesh_type = typename S::mesh_type;
  static constexpr int rank = S::rank;
  /// This rank's block and its ghost cells, row-major: interior element i is at i + width.
  using view_type =
      Kokkos::View<typename detail::halo_data<value_type, rank>::type, Kokkos::LayoutRight>;

  /// The block of a tensor of layout S and global shape `global_shape` on this rank, with
  /// ghost cells `options.width` wide, all set to `edge` (the value past the global edge).
  /// Collective over the mesh (ranks agree on errors).
  HaloField(const mesh_type& mesh, Shape global_shape, HaloOptions options = {},
            value_type edge = value_type{},
            std::source_location where = std::source_location::current())
      : mesh_(mesh), shape_(std::move(global_shape)), options_(options) {
    const detail::UserSite site(where, "HaloField");
    detail::agree_on(mesh_.comm(), "HaloField", [&] { check(); });
    block_ = local_block<S>(mesh_, shape_);
    std::array<std::size_t, 8> e{};
    for (int d = 0; d < rank; ++d)
      e[static_cast<std::size_t>(d)] = static_cast<std::size_t>(
          block_.extents[static_cast<std::size_t>(d)] + 2 * options_.width);
    if constexpr (rank == 1) view_ = view_type("gshard::HaloField", e[0]);
    if constexpr (rank == 2) view_ = view_type("gshard::HaloField", e[0], e[1]);
    if constexpr (rank == 3) view_ = view_type("gshard::HaloField", e[0], e[1], e[2]);
    Kokkos::deep_copy(view_, edge);
    plan_exchange();
  }

  [[nodiscard]] const view_type& view() const noexcept { return view_; }
  [[nodiscard]] std::int64_t width() const noexcept { return options_.width; }
  /// Elements this rank holds per dimension (the interior; 0 where its block is empty).
  [[nodiscard]] const Shape& extents() const noexcept { return block_.extents; }
  /// Global index of the first interior element per dimension.
  [[nodiscard]] const Shape& offsets() const noexcept { return block_.offsets; }
  [[nodiscard]] const Shape& shape() const noexcept { return shape_; }
  [[nodiscard]] const mesh_type& mesh() const noexcept { return mesh_; }

  /// Refreshes the ghost cells from the neighbouring blocks, dimension by dimension. Collective
  /// over the mesh: every rank calls it, also those whose block is empty.
  void exchange(std::source_location where = std::source_location::current()) {
    const detail::UserSite site(where, "HaloField::exchange");
    for (const Side& s : sides_) {
      if (s.send.volume() > 0) detail::copy_box(view_.data(), send_.data(), s.send);
      {
        detail::MpiAccess<value_type> out(send_, true);
        detail::MpiAccess<value_type> in(recv_, false);
        detail::send_recv(out.data(), s.send.volume(), s.dest, in.data(), s.recv.volume(), s.source,
                          s.comm, s.axes);
        in.copy_out();
      }
      if (s.recv.volume() > 0) detail::copy_box(recv_.data(), view_.data(), s.recv);
    }
  }

  /// Writes this rank's block of `t` (global shape shape()) into the interior; ghost cells are
  /// left as they are (call exchange()). Collective over the mesh.
  template <fixed_string Spec>
  void assign(const Sharded<value_type, mesh_type, Spec>& t,
              std::source_location where = std::source_location::current()) {
    static_assert(Sharded<value_type, mesh_type, Spec>::layout == S::layout,
                  "gshard::HaloField::assign: the tensor must have the field's layout");
    const detail::UserSite site(where, "HaloField::assign");
    detail::agree(mesh_.comm(), "HaloField::assign",
                  t.shape() == shape_ ? std::string()
                                      : t.describe() + " is not of the field's global shape " +
                                            detail::shape_string(shape_));
    detail::copy_box(t.local_view().data(), view_.data(), interior_box(/*into_view=*/true));
  }

  /// The interior as a new tensor of layout S (a copy; no communication).
  [[nodiscard]] S tensor() const {
    S out(mesh_, shape_);
    detail::copy_box(view_.data(), out.local_view().data(), interior_box(/*into_view=*/false));
    return out;
  }

 private:
  // One send_recv: pack `send` (a box of the view) for `dest`, unpack what `source` sends into
  // the `recv` box; in the group communicator of the dimension's axes.
  struct Side {
    detail::BoxCopy send, recv;
    int dest = MPI_PROC_NULL, source = MPI_PROC_NULL;
    MPI_Comm comm = MPI_COMM_SELF;
    std::string axes;
  };

  void check() const {
    if (static_cast<int>(shape_.size()) != rank)
      throw Error("HaloField", "spec \"" + std::string(S::spec_string()) + "\" has " +
                                   std::to_string(rank) + " dimensions but the global shape " +
                                   detail::shape_string(shape_) + " has " +
                                   std::to_string(shape_.size()));
    if (options_.width < 0)
      throw Error("HaloField", "the halo width " + std::to_string(options_.width) + " is negative");
    // Ghost cells come from the next block only: each split dimension's blocks must be at least
    // as wide as the halo (the last block may be shorter: past it is the edge).
    for (int d = 0; d < rank; ++d) {
      const auto& dim = S::layout.dims[d];
      const std::int64_t n = shape_[static_cast<std::size_t>(d)];
      const int k = detail::shard_count(dim, mesh_.sizes());
      const std::int64_t chunk = detail::ceil_div(n, k);
      if (k > 1 && chunk < options_.width)
        throw Error("HaloField",
                    "dimension " + std::to_string(d) + " of \"" + std::string(S::spec_string()) +
                        "\" (size " + std::to_string(n) + " over " + std::to_string(k) +
                        " blocks of " + std::to_string(chunk) +
                        ") is narrower than the halo width " + std::to_string(options_.width) +
                        "; use fewer blocks along it or a narrower halo");
    }
  }

  // The interior of the view against the padded row-major shard of a tensor of layout S.
  [[nodiscard]] detail::BoxCopy interior_box(bool into_view) const {
    return detail::block_box(block_.extents, block_.padded, detail::view_strides(view_), into_view,
                             options_.width);
  }

  // The two send_recv of every split dimension, and buffers for the largest border.
  void plan_exchange() {
    const std::int64_t w = options_.width;
    std::vector<std::string> names;
    for (auto a : mesh_type::axis_names) names.emplace_back(a);
    const auto& state = detail::mesh_state(mesh_);
    const Shape vs = detail::view_strides(view_);
    std::int64_t largest = 0;
    for (int d = 0; d < rank && w > 0; ++d) {
      const auto& dim = S::layout.dims[d];
      const int k = detail::shard_count(dim, mesh_.sizes());
      if (k == 1) continue;  // past both ends is the edge
      const int me = detail::shard_index(dim, mesh_.sizes(), mesh_.coordinates());
      auto valid_of = [&](int i) {
        if (i < 0 || i >= k) return std::int64_t{0};
        const std::int64_t n = shape_[static_cast<std::size_t>(d)];
        const std::int64_t chunk = detail::ceil_div(n, k);
        return std::clamp<std::int64_t>(n - chunk * i, 0, chunk);
      };
      const std::int64_t mine = valid_of(me);
      // A slab: `rows` rows of dimension d starting at view row `at`; the other dimensions
      // span the interior, or the whole view with corners.
      auto slab = [&](std::int64_t rows, std::int64_t at) {
        detail::BoxCopy b;
        b.rank = rank;
        for (int e = 0; e < rank; ++e) {
          const auto u = static_cast<std::size_t>(e);
          const bool whole = options_.corners && e != d;
          b.box[e] = e == d ? rows : block_.extents[u] + (whole ? 2 * w : 0);
          b.src_start[e] = b.dst_start[e] = e == d ? at : (whole ? 0 : w);
          b.src_stride[e] = b.dst_stride[e] = vs[u];
        }
        if (mine == 0) b.box[d] = 0;  // an empty block sends and receives nothing
        return b;
      };
      // Packed buffers are row-major over the box: the sending side reads the view's strides,
      // writes packed ones; the receiving side the other way round.
      auto packed = [&](detail::BoxCopy b, bool into_view) {
        std::int64_t p[max_dims]{};
        detail::row_major_strides(rank, b.box, p);
        for (int e = 0; e < rank; ++e) {
          if (into_view) {
            b.src_stride[e] = p[e];
            b.src_start[e] = 0;
          } else {
            b.dst_stride[e] = p[e];
            b.dst_start[e] = 0;
          }
        }
        return b;
      };
      const unsigned mask = detail::axes_of(dim);
      const MPI_Comm comm = state.groups[mask];
      const std::string axes = detail::axes_string(mask, names);
      const std::int64_t to_prev = valid_of(me - 1) > 0 ? std::min(w, mine) : 0;
      const std::int64_t from_next = valid_of(me + 1) > 0 ? std::min(w, valid_of(me + 1)) : 0;
      const std::int64_t to_next = valid_of(me + 1) > 0 ? std::min(w, mine) : 0;
      const std::int64_t from_prev = valid_of(me - 1) > 0 ? std::min(w, valid_of(me - 1)) : 0;
      auto rank_of = [&](int i) { return detail::conv_block_group_rank(dim, i, mesh_.sizes()); };
      Side down;  // my first rows to the previous block; the next block's into my high ghosts
      down.send = packed(slab(to_prev, w), false);
      down.recv = packed(slab(from_next, w + mine), true);
      down.dest = down.send.volume() > 0 ? rank_of(me - 1) : MPI_PROC_NULL;
      down.source = down.recv.volume() > 0 ? rank_of(me + 1) : MPI_PROC_NULL;
      Side up;  // my last rows to the next block; the previous block's into my low ghosts
      up.send = packed(slab(to_next, w + mine - to_next), false);
      up.recv = packed(slab(from_prev, w - from_prev), true);
      up.dest = up.send.volume() > 0 ? rank_of(me + 1) : MPI_PROC_NULL;
      up.source = up.recv.volume() > 0 ? rank_of(me - 1) : MPI_PROC_NULL;
      for (Side* s : {&down, &up}) {
        s->comm = comm;
        s->axes = axes;
        largest = std::max({largest, s->send.volume(), s->recv.volume()});
        sides_.push_back(*s);
      }
    }
    send_ = Kokkos::View<value_type*>("gshard::HaloField send", static_cast<std::size_t>(largest));
    recv_ = Kokkos::View<value_type*>("gshard::HaloField recv", static_cast<std::size_t>(largest));
  }

  mesh_type mesh_;
  Shape shape_;
  HaloOptions options_;
  LocalBlock block_;
  view_type view_;
  std::vector<Side> sides_;
  Kokkos::View<value_type*> send_, recv_;
};

}  // namespace gshard
