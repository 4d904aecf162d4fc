// Finite-difference gradient checks shared by the autodiff tests: smooth inputs away from the
// kinks of piecewise ops, and the relative error of gshard::grad against central differences.
#pragma once

#include <gshard/autodiff/grad.hpp>
#include <gshard/tensor/creation.hpp>

#include "mpi_test.hpp"
#include "op_checks.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <tuple>
#include <utility>
#include <vector>

namespace gshard::test {

// Values away from the kinks of abs, relu, minimum and maximum (|v| >= 0.2), distinct per index.
inline std::vector<double> smooth_values(std::size_t n, unsigned salt) {
  std::vector<double> v(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double u = std::sin(0.7 * static_cast<double>(i) + 1.3 * salt) * 1.5;
    v[i] = u >= 0 ? u + 0.2 : u - 0.2;
  }
  return v;
}

template <class X>
X make(const typename X::mesh_type& mesh, const gshard::Shape& shape, unsigned salt) {
  gshard::Shape::value_type n = 1;
  for (auto s : shape) n *= s;
  const std::vector<double> v = smooth_values(static_cast<std::size_t>(n), salt);
  return gshard::from_global<X>(mesh, shape,
                                std::vector<typename X::value_type>(v.begin(), v.end()));
}

// Central differences of loss_of(xs...) for every global element of every input, against
// gshard::grad: returns the relative error ||g - fd|| / ||fd|| over all inputs.
template <class F, class... X>
double fd_relative_error(F loss_of, X... xs) {
  gshard::track(std::tie(xs...));
  const auto loss = loss_of(xs...);
  const auto grads = gshard::grad(loss, std::tie(xs...));
  gshard::NoGrad off;
  const std::tuple<X...> base(xs...);
  double diff2 = 0, norm2 = 0;
  const double h = 1e-5;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (
        [&] {
          using XI = std::tuple_element_t<I, std::tuple<X...>>;
          const XI& x = std::get<I>(base);
          const std::vector<double> g = std::get<I>(grads).to_global();
          const std::vector<double> v = x.to_global();
          for (std::size_t e = 0; e < v.size(); ++e) {
            auto at = [&](double delta) {
              std::vector<double> p = v;
              p[e] += delta;
              std::tuple<X...> args = base;
              std::get<I>(args) = gshard::from_global<XI>(x.mesh(), x.shape(), p);
              return std::apply(loss_of, args).to_global()[0];
            };
            const double fd = (at(h) - at(-h)) / (2 * h);
            diff2 += (g[e] - fd) * (g[e] - fd);
            norm2 += fd * fd;
          }
        }(),
        ...);
  }
  (std::index_sequence_for<X...>{});
  return std::sqrt(diff2) / std::max(std::sqrt(norm2), 1e-30);
}

/// The world's mesh of type M with the listed sizes (2 or 3 axes).
template <class M>
M mesh_of(const std::vector<int>& s) {
  if constexpr (M::axis_count == 2)
    return M(MPI_COMM_WORLD, {s[0], s[1]});
  else
    return M(MPI_COMM_WORLD, {s[0], s[1], s[2]});
}

/// Calls cases(mesh) on every listed mesh shape of the world: 2-axis shapes on a Mesh<"x", "y">,
/// 3-axis ones on a Mesh<"x", "y", "z">.
template <class F>
void on_every_mesh(F cases) {
  for (const auto& s : listed_mesh_shapes(world_size())) {
    INFO("mesh " << sizes_text(s));
    if (s.size() == 2)
      cases(mesh_of<Mesh<"x", "y">>(s));
    else
      cases(mesh_of<Mesh<"x", "y", "z">>(s));
  }
}

}  // namespace gshard::test
