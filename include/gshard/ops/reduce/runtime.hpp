#pragma once
// The reductions' run-time engine (ops/reduce.hpp): checks every rank makes alike, the sharded
// reduction on run-time layouts (the typed API and the property tests both run it) and its
// gradient.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "../../comm/collectives.hpp"
#include "../../expr/contraction.hpp"
#include "../../expr/node.hpp"
#include "../../spmd/reshard.hpp"
#include "local.hpp"

namespace gshard {
namespace detail {

/// In-place AllReduce of a whole View over the axes in `mask`; nothing when they multiply to 1
/// (as the reshard planner elides steps over size-1 axes).
template <class T>
void all_reduce_axes(const Kokkos::View<T*>& v, ReduceOp op, const MeshState& mesh, unsigned mask,
                     const std::vector<std::string>& axis_names) {
  if (group_size_of(mask, mesh.sizes) == 1) return;
  MpiAccess<T> h(v, true);
  all_reduce(h.data(), static_cast<std::int64_t>(v.extent(0)), op, mesh.groups[mask],
             axes_string(mask, axis_names));
  h.copy_out();
}

inline std::string describe_input(const Layout& l, const Shape& shape,
                                  const std::vector<std::string>& axis_names,
                                  const char* what = "input") {
  std::string s = what;
  s += ' ';
  s += quoted_layout(l, axis_names);
  s += " of global shape ";
  s += shape_string(shape);
  return s;
}

/// Run-time checks every rank makes alike (they depend on layouts and shapes only).
inline void check_reduce_input(const std::string& op, std::string_view labels, const Layout& l,
                               const Shape& shape, bool needs_elements,
                               const std::vector<std::string>& axis_names) {
  const ReduceLabelCheck c = check_reduce_labels(labels, l);
  const std::string input = describe_input(l, shape, axis_names);
  const std::string over = std::string(" (over \"") + std::string(labels) + "\")";
  if (c.error == 3) throw Error(op, std::string("no labels to reduce over, ") + input);
  if (c.error == 1)
    throw Error(op,
                std::string("label '") + labels[c.at] + "' is not a label of the " + input + over);
  if (c.error == 2)
    throw Error(op,
                std::string("label '") + labels[c.at] + "' appears twice" + over + ", " + input);
  if (needs_elements)
    for (char c2 : labels)
      if (shape[static_cast<std::size_t>(l.find(c2))] == 0)
        throw Error(op, std::string("label '") + c2 + "' has size 0, nothing to reduce" + over +
                            ", " + input);
}

template <class T>
struct Reduced {
  RuntimeTensor<T> value;
  RuntimeTensor<std::int64_t> index;  // argmax/argmin only
};

/// The whole sharded reduction on run-time layouts (the typed API and the property tests both
/// run this). Collective over the mesh.
template <class T>
Reduced<T> reduce_runtime(Reduction kind, std::string_view labels, const MeshState& mesh,
                          const std::vector<std::string>& axis_names, const RuntimeTensor<T>& in) {
  const std::string op = reduction_name(kind);
  const bool linear = reduction_is_linear(kind);
  check_reduce_input(op, labels, in.layout, in.shape,
                     kind != Reduction::sum && kind != Reduction::norm, axis_names);
  if (linear && in.layout.partial_count > 0 && in.partial_op != ReduceOp::sum)
    throw Error(op, std::string("the ") + describe_input(in.layout, in.shape, axis_names) +
                        " holds pending max/min partials, which a sum cannot keep; finish them "
                        "with reshard first");
  if constexpr (!std::is_floating_point_v<T>)
    if (kind == Reduction::mean || kind == Reduction::logsumexp || kind == Reduction::norm)
      throw Error(op, "needs float or double elements");
  const RuntimeTensor<T> x = linear ? in : finish_pending(in, mesh, axis_names);
  const ReduceShape g = reduce_shape(x.layout, x.shape, mesh, labels);
  const unsigned mask = reduced_axes(x.layout, labels);
  Reduced<T> r;
  r.value.layout = reduce_layout(x.layout, labels, linear);
  for (int d = 0; d < x.layout.rank; ++d)
    if (labels.find(x.layout.dims[d].label) == std::string_view::npos)
      r.value.shape.push_back(x.shape[static_cast<std::size_t>(d)]);
  auto fresh = [&](const char* name) {
    return Kokkos::View<T*>(Kokkos::view_alloc(std::string(name), Kokkos::WithoutInitializing),
                            g.out_size);
  };
  Kokkos::View<T*> out = fresh("gshard::reduce");
  const Kokkos::View<T*> none;
  const Kokkos::View<std::int64_t*> no_index;
  switch (kind) {
    case Reduction::sum:
    case Reduction::mean: {
      local_reduce<T>(LocalReduce::sum, g, x.data, out, none, no_index);
      if constexpr (std::is_floating_point_v<T>) {
        if (kind != Reduction::mean) break;
        const T scale = static_cast<T>(1) / static_cast<T>(g.global_count);
        Kokkos::parallel_for(
            "gshard::mean", Kokkos::RangePolicy<>(0, g.out_size),
            KOKKOS_LAMBDA(const std::int64_t i) { out(i) *= scale; });
      }
      break;
    }
    case Reduction::max:
    case Reduction::min: {
      const bool max = kind == Reduction::max;
      local_reduce<T>(max ? LocalReduce::max : LocalReduce::min, g, x.data, out, none, no_index);
      all_reduce_axes(out, max ? ReduceOp::max : ReduceOp::min, mesh, mask, axis_names);
      break;
    }
    case Reduction::argmax:
    case Reduction::argmin: {
      const bool max = kind == Reduction::argmax;
      Kokkos::View<std::int64_t*> index(
          Kokkos::view_alloc(std::string("gshard::arg"), Kokkos::WithoutInitializing), g.out_size);
      local_reduce<T>(max ? LocalReduce::argmax : LocalReduce::argmin, g, x.data, out, none, index);
      if (group_size_of(mask, mesh.sizes) > 1) {
        // The winning value first, then the smallest index among the ranks that hold it.
        const Kokkos::View<T*> local = fresh("gshard::arg local");
        Kokkos::deep_copy(local, out);
        all_reduce_axes(out, max ? ReduceOp::max : ReduceOp::min, mesh, mask, axis_names);
        constexpr std::int64_t none_here = std::numeric_limits<std::int64_t>::max();
        Kokkos::parallel_for(
            "gshard::arg candidates", Kokkos::RangePolicy<>(0, g.out_size),
            KOKKOS_LAMBDA(const std::int64_t i) {
              if (!(local(i) == out(i))) index(i) = none_here;
            });
        all_reduce_axes(index, ReduceOp::min, mesh, mask, axis_names);
      }
      r.index = RuntimeTensor<std::int64_t>{r.value.layout, r.value.shape, index, ReduceOp::sum};
      break;
    }
    case Reduction::logsumexp:
    case Reduction::norm:
      if constexpr (std::is_floating_point_v<T>) {
        if (kind == Reduction::norm) {
          local_reduce<T>(LocalReduce::sumsq, g, x.data, out, none, no_index);
          all_reduce_axes(out, ReduceOp::sum, mesh, mask, axis_names);
          Kokkos::parallel_for(
              "gshard::norm", Kokkos::RangePolicy<>(0, g.out_size),
              KOKKOS_LAMBDA(const std::int64_t i) { out(i) = math::sqrt(out(i)); });
          break;
        }
        local_reduce<T>(LocalReduce::max, g, x.data, out, none, no_index);
        all_reduce_axes(out, ReduceOp::max, mesh, mask, axis_names);
        Kokkos::View<T*> s = fresh("gshard::logsumexp sum");
        local_reduce<T>(LocalReduce::sumexp, g, x.data, s, out, no_index);
        all_reduce_axes(s, ReduceOp::sum, mesh, mask, axis_names);
        const T lowest = -std::numeric_limits<T>::infinity();
        Kokkos::parallel_for(
            "gshard::logsumexp", Kokkos::RangePolicy<>(0, g.out_size),
            KOKKOS_LAMBDA(const std::int64_t i) {
              // Padded rows hold max 0 and sum 0: keep them 0.
              if (s(i) == T{} && out(i) == T{}) return;
              if (out(i) == lowest) return;  // every element -inf: the result is -inf
              out(i) += math::log(s(i));
            });
      }
      break;
  }
  r.value.data = out;
  return r;
}

/// The gradient of a reduction: the result's cotangent broadcast back along the reduced labels,
/// times d(result)/dx: 1 (sum), 1/count (mean), the indicator of the extremum (max, min; every
/// tie gets it), exp(x - result) (logsumexp), x / result (norm).
template <class T>
RuntimeTensor<T> reduce_cotangent(Reduction kind, double count, const RuntimeTensor<T>& x,
                                  const RuntimeTensor<T>& result, const RuntimeTensor<T>& g,
                                  const MeshState& mesh,
                                  const std::vector<std::string>& axis_names) {
  const RuntimeTensor<T> gb = broadcast_runtime(g, x.layout, x.shape, mesh, axis_names);
  if (kind == Reduction::sum) return gb;
  Kokkos::View<T*> out(
      Kokkos::view_alloc(std::string("gshard::reduce_grad"), Kokkos::WithoutInitializing),
      gb.data.extent(0));
  const Kokkos::View<T*> gv = gb.data;
  if (kind == Reduction::mean) {
    const T scale = static_cast<T>(1.0 / count);
    Kokkos::parallel_for(
        "gshard::reduce_grad", Kokkos::RangePolicy<>(0, out.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) { out(i) = gv(i) * scale; });
  } else {
    const Kokkos::View<T*> xv = x.data;
    const Kokkos::View<T*> rv =
        broadcast_runtime(result, finished_layout(x.layout), x.shape, mesh, axis_names).data;
    const bool extremum = kind == Reduction::max || kind == Reduction::min;
    const bool lse = kind == Reduction::logsumexp;
    Kokkos::parallel_for(
        "gshard::reduce_grad", Kokkos::RangePolicy<>(0, out.extent(0)),
        KOKKOS_LAMBDA(std::size_t i) {
          const T d =
              extremum ? T(xv(i) == rv(i) ? 1 : 0)
                       : (lse ? math::exp(xv(i) - rv(i)) : (rv(i) != T(0) ? xv(i) / rv(i) : T(0)));
          out(i) = gv(i) * d;
        });
  }
  return RuntimeTensor<T>(gb.layout, gb.shape, out, ReduceOp::sum);
}

}  // namespace detail
}  // namespace gshard
