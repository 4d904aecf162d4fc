#pragma once
// Random ops with the global-index generator of tensor/random.hpp: each random number is a pure
// function of (seed, global row-major index in the tensor's label order), so results are the
// same on every mesh and layout, and no op here communicates.
//
//   dropout(x, rate, seed): x * keep / (1 - rate), keep = (u >= rate) where u = random_unit(seed,
//     g, 0) is exactly the value random_uniform<S>(mesh, shape, seed) gives element g. Same layout
//     as x. A pending partial input stays pending: for a fixed mask dropout is linear (and
//     commutes with max/min, the scale being positive), and every copy draws the same mask since
//     the mask depends on the global index only, never on the rank.
//   uniform_noise(x, low, high, seed): x + (the value random_uniform<S>(..., seed, low, high)
//     gives element g). Same layout as x; for a pending sum only the copy at coordinate 0 of the
//     partial axes adds the noise (max/min copies all add it), so it stays pending.
//   random_uniform_like(x, seed, low, high), random_normal_like(x, seed, mean, stddev): a fresh
//     tensor of x's shape and layout (without x's pending partial axes), equal to random_uniform /
//     random_normal of that layout (x is not evaluated).
//
// Gradients: dropout's is g * keep / (1 - rate), the mask regenerated from (seed, global index)
// by the same kernel (nothing saved); uniform_noise's is g (the noise is additive); the
// random_*_like tensors do not depend on x's values and carry no gradient.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <source_location>
#include <string>
#include <type_traits>

#include "../expr/node.hpp"
#include "../tensor/local_index.hpp"
#include "../tensor/random.hpp"
#include "../tensor/sharded.hpp"

namespace gshard {

namespace detail {

namespace random_ops {

/// The block of this rank with every copy reporting its global indices (also over partial axes).
inline BlockIndex block_with_indices(const Layout& l, const Shape& shape, const MeshState& mesh) {
  BlockIndex b = block_index(l, shape, mesh.sizes, mesh.coords);
  b.holds_values = true;
  return b;
}

inline bool holds_first_copy(const Layout& l, const MeshState& mesh) {
  for (int i = 0; i < l.partial_count; ++i)
    if (mesh.coords[static_cast<std::size_t>(l.partial[i])] != 0) return false;
  return true;
}

}  // namespace random_ops

/// dropout on a run-time tensor: keep element g when random_unit(seed, g, 0) >= rate, scaled by
/// 1/(1-rate). Same layout and partial op as x; padding stays zero.
template <class T>
RuntimeTensor<T> dropout_runtime(const MeshState& mesh, const RuntimeTensor<T>& x, double rate,
                                 std::uint64_t seed) {
  static_assert(std::is_floating_point_v<T>, "gshard::dropout needs float or double");
  if (!(rate >= 0.0 && rate < 1.0))
    throw Error("dropout", "the rate must lie in [0, 1), got " + std::to_string(rate) +
                               " (tensor of global shape " + shape_string(x.shape) + ")");
  const BlockIndex b = random_ops::block_with_indices(x.layout, x.shape, mesh);
  const T scale = static_cast<T>(1.0 / (1.0 - rate));
  RuntimeTensor<T> out{x.layout, x.shape, {}, x.partial_op};
  out.data = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::dropout"), Kokkos::WithoutInitializing),
      x.data.extent(0));
  const Kokkos::View<T*> o = out.data;
  const Kokkos::View<T*> in = x.data;
  Kokkos::parallel_for(
      "gshard::dropout", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(in.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t g = b.global_of(i);
        const bool keep = g >= 0 && random_unit(seed, static_cast<std::uint64_t>(g), 0) >= rate;
        o(i) = keep ? in(i)*scale : T{};
      });
  return out;
}

/// x + uniform noise in [low, high) on a run-time tensor (see the top of this file).
template <class T>
RuntimeTensor<T> uniform_noise_runtime(const MeshState& mesh, const RuntimeTensor<T>& x, T low,
                                       T high, std::uint64_t seed) {
  if (!(low < high))
    throw Error("uniform_noise", "the range [" + std::to_string(low) + ", " + std::to_string(high) +
                                     ") is empty (tensor of global shape " + shape_string(x.shape) +
                                     ")");
  const BlockIndex b = random_ops::block_with_indices(x.layout, x.shape, mesh);
  // A pending sum gets the noise once, on the copy at coordinate 0 of its partial axes.
  const bool adds = x.partial_op != ReduceOp::sum || random_ops::holds_first_copy(x.layout, mesh);
  RuntimeTensor<T> out{x.layout, x.shape, {}, x.partial_op};
  out.data = Kokkos::View<T*>(
      Kokkos::view_alloc(std::string("gshard::uniform_noise"), Kokkos::WithoutInitializing),
      x.data.extent(0));
  const Kokkos::View<T*> o = out.data;
  const Kokkos::View<T*> in = x.data;
  Kokkos::parallel_for(
      "gshard::uniform_noise", Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(in.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t g = b.global_of(i);
        if (g < 0)
          o(i) = T{};
        else
          o(i) = adds ? static_cast<T>(in(i) + uniform_value<T>(seed, g, low, high)) : in(i);
      });
  return out;
}

enum class RandomKind { uniform, normal };

/// A fresh random tensor of `layout` (no partial axes) and global `shape`: uniform in [a, b) or
/// normal with mean a and standard deviation b.
template <class T>
RuntimeTensor<T> random_like_runtime(const MeshState& mesh, const Layout& layout,
                                     const Shape& shape, RandomKind kind, std::uint64_t seed, T a,
                                     T b) {
  const char* op = kind == RandomKind::uniform ? "random_uniform_like" : "random_normal_like";
  if (kind == RandomKind::uniform && !(a < b))
    throw Error(op, "the range [" + std::to_string(a) + ", " + std::to_string(b) +
                        ") is empty (global shape " + shape_string(shape) + ")");
  const Layout l = finished_layout(layout);
  const BlockIndex bi = random_ops::block_with_indices(l, shape, mesh);
  RuntimeTensor<T> out{l, shape, {}, ReduceOp::sum};
  out.data =
      Kokkos::View<T*>(Kokkos::view_alloc(std::string(op), Kokkos::WithoutInitializing),
                       static_cast<std::size_t>(product(local_extents(l, shape, mesh.sizes))));
  const Kokkos::View<T*> o = out.data;
  const bool uniform = kind == RandomKind::uniform;
  Kokkos::parallel_for(
      op, Kokkos::RangePolicy<>(0, static_cast<std::int64_t>(o.extent(0))),
      KOKKOS_LAMBDA(const std::int64_t i) {
        const std::int64_t g = bi.global_of(i);
        if (g < 0) {
          o(i) = T{};
        } else if (uniform) {
          o(i) = uniform_value<T>(seed, g, a, b);
        } else {
          if constexpr (std::is_floating_point_v<T>)
            o(i) =
                static_cast<T>(a + b * random_standard_normal(seed, static_cast<std::uint64_t>(g)));
        }
      });
  return out;
}

template <fixed_string Op, class E>
constexpr bool check_floating() {
  if constexpr (std::is_floating_point_v<typename E::value_type>)
    return true;
  else
    return sizeof(random_error::needs_floating_point<detail::shown<Op>, detail::shown<E::spec>>) ==
           0;
}

template <class E>
using same_layout_result = Sharded<typename E::value_type, typename E::mesh_type,
                                   spec_of<typename E::mesh_type, E::layout>()>;

template <class E>
using unpartial_result = Sharded<typename E::value_type, typename E::mesh_type,
                                 spec_of<typename E::mesh_type, finished_layout(E::layout)>()>;

}  // namespace detail

/// Dropout: each element kept with probability 1 - rate and scaled by 1/(1 - rate), the keep mask
/// a pure function of (seed, global index). Same layout as x (a pending partial stays pending).
/// Eager; no communication.
template <Expression E>
auto dropout(const E& x, Seed seed_, double rate,
             std::source_location where = std::source_location::current()) {
  const std::uint64_t seed = seed_.value;
  const detail::UserSite site(where, "dropout");
  if constexpr (!detail::check_floating<"dropout", E>()) {
    return 0;
  } else {
    using R = detail::same_layout_result<E>;
    using T = typename E::value_type;
    const auto v = detail::materialise(x);
    auto r = detail::dropout_runtime(detail::mesh_state(x.mesh()), v, rate, seed);
    // The mask is regenerated from (seed, global index) rather than kept: g * keep / (1 - rate).
    detail::record(x.mesh(), r, "dropout", where, {v.grad},
                   [rate, seed, m = x.mesh()](const detail::RuntimeTensor<T>& g) {
                     return detail::Cotangents{detail::AnyTensor(
                         detail::dropout_runtime<T>(detail::mesh_state(m), g, rate, seed))};
                   });
    return detail::sharded_from<R>(x.mesh(), r);
  }
}

/// x plus noise uniform in [low, high), a pure function of (seed, global index). Same layout as
/// x. Eager; no communication.
template <Expression E>
auto uniform_noise(const E& x, Seed seed, typename E::value_type low, typename E::value_type high,
                   std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "uniform_noise");
  if constexpr (!detail::check_floating<"uniform_noise", E>()) {
    return 0;
  } else {
    using R = detail::same_layout_result<E>;
    using T = typename E::value_type;
    const auto v = detail::materialise(x);
    auto r = detail::uniform_noise_runtime(detail::mesh_state(x.mesh()), v, low, high, seed.value);
    // The noise is additive and does not depend on x: the cotangent passes through unchanged.
    detail::record(
        x.mesh(), r, "uniform_noise", where, {v.grad},
        [](const detail::RuntimeTensor<T>& g) { return detail::Cotangents{detail::AnyTensor(g)}; });
    return detail::sharded_from<R>(x.mesh(), r);
  }
}

/// A tensor shaped and laid out like x (without its pending partial axes), uniform in [low,
/// high): the same values as random_uniform of that layout. x is not evaluated.
template <Expression E>
auto random_uniform_like(const E& x, Seed seed, typename E::value_type low = 0,
                         typename E::value_type high = 1,
                         std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "random_uniform_like");
  if (!(low < high))
    throw Error("random_uniform_like",
                "the range [" + std::to_string(low) + ", " + std::to_string(high) + ") is empty");
  using T = typename E::value_type;
  using R = detail::unpartial_result<E>;
  const auto r = detail::random_like_runtime<T>(detail::mesh_state(x.mesh()), E::layout, x.shape(),
                                                detail::RandomKind::uniform, seed.value, low, high);
  return R(x.mesh(), r.shape, r.data);
}

/// A tensor shaped and laid out like x (without its pending partial axes), normal with the given
/// mean and standard deviation: the same values as random_normal of that layout.
template <Expression E>
auto random_normal_like(const E& x, Seed seed, typename E::value_type mean = 0,
                        typename E::value_type stddev = 1,
                        std::source_location where = std::source_location::current()) {
  const detail::UserSite site(where, "random_normal_like");
  if constexpr (!detail::check_floating<"random_normal_like", E>()) {
    return 0;
  } else {
    using T = typename E::value_type;
    using R = detail::unpartial_result<E>;
    const auto r =
        detail::random_like_runtime<T>(detail::mesh_state(x.mesh()), E::layout, x.shape(),
                                       detail::RandomKind::normal, seed.value, mean, stddev);
    return R(x.mesh(), r.shape, r.data);
  }
}

}  // namespace gshard
