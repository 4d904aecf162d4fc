#pragma once
// The recording half of reverse-mode autodiff: the graph node a value carries, and how an op
// records one. Every tensor value (Sharded, and RuntimeTensor inside the engine) holds a shared
// pointer to the node that made it, or none. An op whose inputs carry nodes records a node with
// a closure computing its inputs' cotangents from its own; the closure captures exactly the
// values the backward needs, and the driver (autodiff/grad.hpp) drops it once it has run.
//
// Lives in tensor/ because every tensor holds its node; the driver, which reshards cotangents,
// sits above ops/ (autodiff/grad.hpp).
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <variant>
#include <vector>

#include "../comm/collectives.hpp"
#include "../core/layout.hpp"
#include "../mesh/mesh.hpp"
#include "geometry.hpp"

namespace gshard {

namespace detail {

struct GradNode;

/// How often a shard was updated in place, and the last update's op and line. Handles of one
/// shard share it; a lazy expression remembers the counts of the shards it reads when it is
/// built and refuses to produce a value once one of them has moved (expr/node.hpp).
struct ShardVersion {
  std::uint64_t count = 0;
  const char* op = "";
  UserSiteState site;  // the user's line of the last update
  // What owns the shard's memory when it is not the shard's own View: an application's View that
  // adopt() aliased (tensor/adopt.hpp), kept alive by every handle to the shard.
  std::shared_ptr<const void> storage;
};

/// A tensor as the run-time engine sees it: layout, global shape (layout order), local shard,
/// how pending partials combine, and the autodiff node that made it (none: not tracked).
template <class T>
struct RuntimeTensor {
  Layout layout{};
  Shape shape;
  Kokkos::View<T*> data;
  ReduceOp partial_op = ReduceOp::sum;
  std::shared_ptr<GradNode> grad;
  std::shared_ptr<ShardVersion> version;  // set when `data` is a Sharded's shard (else fresh)

  RuntimeTensor() = default;
  RuntimeTensor(Layout l, Shape s, Kokkos::View<T*> d, ReduceOp op = ReduceOp::sum,
                std::shared_ptr<GradNode> g = {})
      : layout(l), shape(std::move(s)), data(std::move(d)), partial_op(op), grad(std::move(g)) {}
};

/// A cotangent: gradients flow in float or double (integer values are never differentiated).
using AnyTensor = std::variant<RuntimeTensor<float>, RuntimeTensor<double>>;
/// One cotangent per input of a node (none: that input gets no gradient from this node).
using Cotangents = std::vector<std::optional<AnyTensor>>;

/// A node of the autodiff graph: one recorded op application, or a tracked leaf.
///
/// The backward closure receives the cotangent of this node's value in the node's own layout
/// (the same dimensions and splits), possibly still partial over mesh axes that the layout
/// neither splits nor holds partials on, always in the node's element type.
struct GradNode {
  std::uint64_t sequence = 0;  // creation order, the same on every rank: a topological order
  std::string op;
  std::source_location where;
  UserSiteState site;  // the user's line that recorded it (the backward pass traces it there)
  std::shared_ptr<const MeshState> mesh;
  std::vector<std::string> axis_names;
  Layout layout{};
  Shape shape;
  bool is_double = false;
  bool is_leaf = false;
  bool released = false;  // its backward ran (or was dropped) in an earlier grad()
  std::vector<std::shared_ptr<GradNode>> inputs;
  std::function<Cotangents(const AnyTensor&)> backward;
};

inline std::uint64_t next_node_sequence() {
  static std::uint64_t counter = 0;
  return ++counter;
}

/// > 0 while ops must not record (inside NoGrad, and while the backward pass runs).
inline int& no_grad_depth() {
  thread_local int depth = 0;
  return depth;
}
inline bool recording() { return no_grad_depth() == 0; }

template <class MeshT>
std::vector<std::string> mesh_axis_names() {
  std::vector<std::string> names;
  for (auto n : MeshT::axis_names) names.emplace_back(n);
  return names;
}

template <class T>
inline constexpr bool differentiable_v = std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
RuntimeTensor<T> cotangent_as(const AnyTensor& g);

/// A fresh node describing a value of type T (not yet linked into a graph).
template <class T, class MeshT>
std::shared_ptr<GradNode> make_node(const MeshT& mesh, std::string op, std::source_location where,
                                    const Layout& layout, const Shape& shape) {
  auto n = std::make_shared<GradNode>();
  n->sequence = next_node_sequence();
  n->op = std::move(op);
  n->where = where;
  n->site = user_site_state();
  if (n->site.file == nullptr) n->site = {where.file_name(), where.line()};
  n->mesh = detail::mesh_state_handle(mesh);
  n->axis_names = mesh_axis_names<MeshT>();
  n->layout = layout;
  n->shape = shape;
  n->is_double = std::is_same_v<T, double>;
  return n;
}

/// Records `out` as made by `op` from values carrying `inputs` (null: an untracked input).
/// Nothing is recorded when no input is tracked, when recording is off, or for integer
/// results. `backward(g)`, with g a RuntimeTensor<T> in out's layout (see GradNode), returns one
/// cotangent per input, in any layout with that input's labels.
template <class T, class MeshT, class Backward>
void record(const MeshT& mesh, RuntimeTensor<T>& out, std::string op, std::source_location where,
            std::vector<std::shared_ptr<GradNode>> inputs, Backward backward) {
  if constexpr (!differentiable_v<T>) {
    return;
  } else {
    if (!recording()) return;
    bool any = false;
    for (const auto& i : inputs) any = any || i != nullptr;
    if (!any) return;
    auto n = make_node<T>(mesh, std::move(op), where, out.layout, out.shape);
    n->inputs = std::move(inputs);
    n->backward = [b = std::move(backward)](const AnyTensor& g) -> Cotangents {
      return b(cotangent_as<T>(g));
    };
    out.grad = std::move(n);
  }
}

/// The node of a relabelled value (Sharded::as): the same data under other labels. Its
/// backward renames the cotangent's labels back, by position.
template <class T, class MeshT>
std::shared_ptr<GradNode> relabel_node(const MeshT& mesh, const std::shared_ptr<GradNode>& input,
                                       const Layout& from, const Layout& to, const Shape& shape) {
  if (!input || !recording() || !differentiable_v<T>) return nullptr;
  auto n = make_node<T>(mesh, "as", std::source_location{}, to, shape);
  n->inputs = {input};
  n->backward = [from](const AnyTensor& g) -> Cotangents {
    return {std::visit(
        [&](auto t) -> AnyTensor {
          for (int d = 0; d < t.layout.rank; ++d) t.layout.dims[d].label = from.dims[d].label;
          t.grad = nullptr;
          return t;
        },
        g)};
  };
  return n;
}

template <class T, class S>
RuntimeTensor<T> converted(const RuntimeTensor<S>& s) {
  Kokkos::View<T*> out(
      Kokkos::view_alloc(std::string("gshard::cotangent"), Kokkos::WithoutInitializing),
      s.data.extent(0));
  const Kokkos::View<S*> in = s.data;
  Kokkos::parallel_for(
      "gshard::cotangent_cast", Kokkos::RangePolicy<>(0, in.extent(0)),
      KOKKOS_LAMBDA(std::size_t i) { out(i) = static_cast<T>(in(i)); });
  return RuntimeTensor<T>(s.layout, s.shape, out, ReduceOp::sum);
}

/// A cotangent in element type T (converted when it flows in the other floating type).
template <class T>
RuntimeTensor<T> cotangent_as(const AnyTensor& g) {
  if (const auto* t = std::get_if<RuntimeTensor<T>>(&g)) return *t;
  using Other = std::conditional_t<std::is_same_v<T, float>, double, float>;
  return converted<T>(std::get<RuntimeTensor<Other>>(g));
}

}  // namespace detail

/// Turns recording off while it lives (evaluation without a graph, e.g. for evaluation steps or
/// optimizer updates). Nests.
class NoGrad {
 public:
  NoGrad() { ++detail::no_grad_depth(); }
  ~NoGrad() { --detail::no_grad_depth(); }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;
};

}  // namespace gshard
