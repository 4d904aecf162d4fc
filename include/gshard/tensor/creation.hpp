#pragma once
// Creating sharded tensors: constant, random (the same global values on every mesh and layout),
// and from a whole tensor held on every rank. For a layout with partial axes, the values sit on
// the ranks at coordinate 0 of those axes and the other copies hold zeros, so the pending sum
// is the value asked for.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "../comm/agree.hpp"

#include "random.hpp"
#include "sharded.hpp"

namespace gshard {

namespace detail {

// The kernels below are templated on element types only: nvcc cannot compile a device lambda
// inside a function templated on a Sharded or Mesh type (docs/backends.md).

/// data[i] = value_of(global index of i), zero on padding.
template <class T, class ValueOfIndex>
void fill_block(const char* label, const Kokkos::View<T*>& data, const BlockIndex& b,
                ValueOfIndex value_of) {
  Kokkos::parallel_for(
      label, Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(data.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t g = b.global_of(i);
        data(i) = g < 0 ? T{} : value_of(g);
      });
}

template <class T>
struct ConstantValue {
  T value;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t) const { return value; }
};
template <class T>
struct UniformValue {
  std::uint64_t seed;
  T low, high;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t g) const {
    return uniform_value<T>(seed, g, low, high);
  }
};
template <class T>
struct NormalValue {
  std::uint64_t seed;
  T mean, stddev;
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t g) const {
    return static_cast<T>(mean +
                          stddev * random_standard_normal(seed, static_cast<std::uint64_t>(g)));
  }
};

template <class S, class ValueOfIndex>
S fill_by_global_index(const typename S::mesh_type& mesh, Shape shape, const char* label,
                       ValueOfIndex value_of) {
  S out(mesh, std::move(shape));
  fill_block(label, out.local_view(),
             block_index(S::layout, out.shape(), mesh.sizes(), mesh.coordinates()), value_of);
  return out;
}

}  // namespace detail

/// Zeros of the given global shape.
template <ShardedTensor S>
S zeros(const typename S::mesh_type& mesh, Shape shape,
        std::source_location where = std::source_location::current()) {
  return S(mesh, std::move(shape), where);
}

/// Every element equal to `value`.
template <ShardedTensor S>
S full(const typename S::mesh_type& mesh, Shape shape, typename S::value_type value,
       std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "full");
  using T = typename S::value_type;
  return detail::fill_by_global_index<S>(mesh, std::move(shape), "gshard::full",
                                         detail::ConstantValue<T>{value});
}

/// Uniform in [low, high) (integers: low to high-1), a pure function of (seed, global index).
template <ShardedTensor S>
S random_uniform(const typename S::mesh_type& mesh, Shape shape, Seed seed,
                 typename S::value_type low = 0, typename S::value_type high = 1,
                 std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "random_uniform");
  using T = typename S::value_type;
  if (!(low < high))
    throw Error("random_uniform",
                "the range [" + std::to_string(low) + ", " + std::to_string(high) + ") is empty");
  return detail::fill_by_global_index<S>(mesh, std::move(shape), "gshard::random_uniform",
                                         detail::UniformValue<T>{seed.value, low, high});
}

/// Normal with the given mean and standard deviation, a pure function of (seed, global index).
template <ShardedTensor S>
S random_normal(const typename S::mesh_type& mesh, Shape shape, Seed seed,
                typename S::value_type mean = 0, typename S::value_type stddev = 1,
                std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "random_normal");
  using T = typename S::value_type;
  if constexpr (!std::is_floating_point_v<T>)
    static_assert(
        sizeof(random_error::needs_floating_point<detail::shown<fixed_string("random_normal")>,
                                                  detail::shown<S::spec>>) == 0);
  return detail::fill_by_global_index<S>(mesh, std::move(shape), "gshard::random_normal",
                                         detail::NormalValue<T>{seed.value, mean, stddev});
}

/// Each rank passes the whole tensor (row-major, spec order) and keeps its own block.
template <ShardedTensor S>
S from_global(const typename S::mesh_type& mesh, Shape shape,
              std::span<const typename S::value_type> global,
              std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "from_global");
  S out(mesh, std::move(shape));
  // Each rank passes its own vector: agree, so that a rank with the wrong count cannot leave the
  // others waiting in a later collective.
  std::string error;
  if (static_cast<std::int64_t>(global.size()) != out.size())
    error = "a tensor of global shape " + detail::shape_string(out.shape()) + " for \"" +
            std::string(S::spec_string()) + "\" needs " + std::to_string(out.size()) +
            " values, but rank " + std::to_string(mesh.rank()) + " gave " +
            std::to_string(global.size());
  detail::agree(mesh.comm(), "from_global", error);
  const detail::BlockIndex b =
      detail::block_index(S::layout, out.shape(), mesh.sizes(), mesh.coordinates());
  auto host = Kokkos::create_mirror_view(out.local_view());
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(host.extent(0)); ++i) {
    const std::int64_t g = b.global_of(i);
    host(i) = g < 0 ? typename S::value_type{} : global[static_cast<std::size_t>(g)];
  }
  Kokkos::deep_copy(out.local_view(), host);
  return out;
}

template <ShardedTensor S>
S from_global(const typename S::mesh_type& mesh, Shape shape,
              const std::vector<typename S::value_type>& global,
              std::source_location where = std::source_location::current()) {
  return from_global<S>(mesh, std::move(shape),
                        std::span<const typename S::value_type>(global.data(), global.size()),
                        where);
}

}  // namespace gshard
