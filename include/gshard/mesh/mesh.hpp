#pragma once
// gshard::Mesh<"a", "b", ...>: ranks of a communicator arranged as a named, row-major grid.
#include <mpi.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>

#include "../core/error.hpp"
#include "../core/fixed_string.hpp"
#include "../core/layout.hpp"

namespace gshard {

namespace mesh_error {
template <class>
inline constexpr bool always_false = false;
template <auto Axis>
struct mesh_axis_name_used_twice {
  static_assert(always_false<mesh_axis_name_used_twice>, "gshard::Mesh: two axes share a name");
};
template <int Count>
struct mesh_needs_1_to_4_axes {
  static_assert(always_false<mesh_needs_1_to_4_axes<Count>>,
                "gshard::Mesh: give 1 to 4 axis names (the count given is the argument)");
};
template <auto Name, class Mesh>
struct no_axis_named {
  static_assert(always_false<no_axis_named>,
                "gshard::Mesh::axis: the mesh has no axis of that name (the name, the mesh)");
};
template <auto Axis>
struct mesh_axis_name_is_not_an_identifier {
  static_assert(always_false<mesh_axis_name_is_not_an_identifier>,
                "gshard::Mesh: an axis name must be an identifier (letters, digits, '_')");
};
}  // namespace mesh_error

namespace detail {

/// What every Mesh handle shares: the duplicated communicator and one sub-communicator per set
/// of axes (bitmask), all made once, at construction, collectively.
struct MeshState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int axis_count = 0;
  std::array<int, max_axes> sizes{};
  std::array<int, max_axes> coords{};
  std::array<MPI_Comm, 1 << max_axes> groups{};  // groups[mask]: ranks differing only on mask

  MeshState() { groups.fill(MPI_COMM_NULL); }
  MeshState(const MeshState&) = delete;
  MeshState& operator=(const MeshState&) = delete;
  ~MeshState() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized != 0) return;  // too late to free; MPI already released them
    for (MPI_Comm& c : groups)
      if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

inline std::string join_sizes(const int* sizes, int count) {
  std::string s;
  for (int i = 0; i < count; ++i) {
    if (i) s += 'x';
    s += std::to_string(sizes[i]);
  }
  return s;
}

struct MeshAccess;

}  // namespace detail

/// Axis names are part of the type; sizes come at run time and must multiply to the size of the
/// communicator. Rank r sits at row-major coordinates (last axis fastest). Copies are cheap
/// handles to the same communicators.
template <fixed_string... Names>
class Mesh {
  static constexpr bool count_ok = [] {
    if constexpr (sizeof...(Names) >= 1 && sizeof...(Names) <= max_axes)
      return true;
    else
      return sizeof(mesh_error::mesh_needs_1_to_4_axes<static_cast<int>(sizeof...(Names))>) == 0;
  }();
  static_assert(count_ok);

  template <fixed_string Name>
  static constexpr bool check_axis_name() {
    constexpr int uses = (0 + ... + (Names.view() == Name.view() ? 1 : 0));
    if constexpr (!detail::is_name(Name.view())) {
      return sizeof(mesh_error::mesh_axis_name_is_not_an_identifier<detail::shown<Name>>) == 0;
    } else if constexpr (uses > 1) {
      return sizeof(mesh_error::mesh_axis_name_used_twice<detail::shown<Name>>) == 0;
    } else {
      return true;
    }
  }
  static_assert((check_axis_name<Names>() && ...));

 public:
  static constexpr int axis_count = sizeof...(Names);
  static constexpr std::array<std::string_view, sizeof...(Names)> axis_names{Names.view()...};

  /// Arranges the ranks of `comm` (duplicated, so gshard's messages never mix with the
  /// application's) as a grid of `sizes`. Collective over `comm`.
  Mesh(MPI_Comm comm, std::initializer_list<int> sizes,
       std::source_location where = std::source_location::current()) {
    const detail::UserSite site(where, "Mesh");
    int comm_size = 0;
    MPI_Comm_size(comm, &comm_size);
    if (static_cast<int>(sizes.size()) != axis_count)
      throw Error("Mesh", "the mesh " + describe_names() + " has " + std::to_string(axis_count) +
                              " axes but " + std::to_string(sizes.size()) + " sizes were given");
    auto state = std::make_shared<detail::MeshState>();
    state->axis_count = axis_count;
    long long product = 1;
    int a = 0;
    for (int s : sizes) {
      if (s < 1)
        throw Error("Mesh", "axis '" + std::string(axis_names[a]) + "' of " + describe_names() +
                                " has size " + std::to_string(s) + "; sizes must be at least 1");
      state->sizes[a++] = s;
      product *= s;
    }
    if (product != comm_size)
      throw Error("Mesh", "axis sizes " + detail::join_sizes(state->sizes.data(), axis_count) +
                              " of " + describe_names() + " make " + std::to_string(product) +
                              " ranks, but the communicator has " + std::to_string(comm_size));
    MPI_Comm_dup(comm, &state->comm);
    MPI_Comm_rank(state->comm, &state->rank);
    state->size = comm_size;
    for (int i = axis_count - 1, r = state->rank; i >= 0; --i) {
      state->coords[i] = r % state->sizes[i];
      r /= state->sizes[i];
    }
    // One communicator per set of axes: ranks that agree on every other axis, ordered
    // row-major over the set's axes (so group rank = coordinate index within the set).
    for (int mask = 1; mask < (1 << axis_count); ++mask) {
      int color = 0;
      int key = 0;
      for (int i = 0; i < axis_count; ++i) {
        if (mask & (1 << i)) {
          key = key * state->sizes[i] + state->coords[i];
        } else {
          color = color * state->sizes[i] + state->coords[i];
        }
      }
      MPI_Comm_split(state->comm, color, key, &state->groups[mask]);
    }
    state_ = std::move(state);
  }

  [[nodiscard]] MPI_Comm comm() const noexcept { return state_->comm; }
  [[nodiscard]] int rank() const noexcept { return state_->rank; }
  [[nodiscard]] int size() const noexcept { return state_->size; }
  [[nodiscard]] int axis_size(int axis) const noexcept { return state_->sizes[axis]; }
  [[nodiscard]] int coordinate(int axis) const noexcept { return state_->coords[axis]; }
  [[nodiscard]] const std::array<int, max_axes>& sizes() const noexcept { return state_->sizes; }
  [[nodiscard]] const std::array<int, max_axes>& coordinates() const noexcept {
    return state_->coords;
  }

  /// Index of an axis by name at compile time: Mesh::axis<"data">().
  template <fixed_string Name>
  static constexpr int axis() {
    constexpr int index = detail::find_axis(axis_names, Name.view());
    if constexpr (index < 0)
      return sizeof(mesh_error::no_axis_named<detail::shown<Name>, Mesh>) == 0;
    else
      return index;
  }
  /// Index of an axis by name at run time; throws for an unknown name.
  [[nodiscard]] int axis(std::string_view name) const {
    const int index = detail::find_axis(axis_names, name);
    if (index < 0)
      throw Error("Mesh", "no axis named '" + std::string(name) + "' in " + describe_names());
    return index;
  }

  /// The rank at the given coordinates (row-major).
  [[nodiscard]] int rank_at(const std::array<int, max_axes>& coords) const noexcept {
    int r = 0;
    for (int i = 0; i < axis_count; ++i) r = r * state_->sizes[i] + coords[i];
    return r;
  }
  /// The coordinates of a rank.
  [[nodiscard]] std::array<int, max_axes> coordinates_of(int rank) const noexcept {
    std::array<int, max_axes> c{};
    for (int i = axis_count - 1; i >= 0; --i) {
      c[i] = rank % state_->sizes[i];
      rank /= state_->sizes[i];
    }
    return c;
  }
  /// The communicator of the ranks that differ from this one only on the axes in `mask`
  /// (bit i = axis i); its ranks are row-major over those axes.
  [[nodiscard]] MPI_Comm group(unsigned mask) const noexcept {
    return mask == 0 ? MPI_COMM_SELF : state_->groups[mask];
  }

  /// "Mesh<data=2, expert=4>"
  [[nodiscard]] std::string describe() const {
    std::string s = "Mesh<";
    for (int i = 0; i < axis_count; ++i)
      s.append(i ? ", " : "")
          .append(axis_names[i])
          .append("=")
          .append(std::to_string(state_->sizes[i]));
    return s + ">";
  }

 private:
  friend struct detail::MeshAccess;

  static std::string describe_names() {
    std::string s = "Mesh<";
    for (int i = 0; i < axis_count; ++i)
      s.append(i ? ", \"" : "\"").append(axis_names[i]).append("\"");
    return s + ">";
  }

  std::shared_ptr<detail::MeshState> state_;
};

namespace detail {

/// The library's access to a mesh's run-time state (not part of the public surface).
struct MeshAccess {
  template <class M>
  static const MeshState& state(const M& m) noexcept {
    return *m.state_;
  }
  template <class M>
  static std::shared_ptr<const MeshState> handle(const M& m) noexcept {
    return m.state_;
  }
};

/// The shared run-time state (communicators, sizes, coordinates) for non-template code.
template <class M>
const MeshState& mesh_state(const M& m) noexcept {
  return MeshAccess::state(m);
}
/// The same state as a shared handle (kept by autodiff nodes for the backward pass).
template <class M>
std::shared_ptr<const MeshState> mesh_state_handle(const M& m) noexcept {
  return MeshAccess::handle(m);
}

}  // namespace detail

}  // namespace gshard
