#pragma once
// What the op-library property tests share: text of shapes and meshes, the meshes under test,
// values and shards per element type, and the check of a result block's padding and partial sums.
#include <mpi.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include <gshard/core/layout.hpp>
#include <gshard/mesh/mesh.hpp>
#include <gshard/spmd/plan.hpp>

#include "block_reference.hpp"
#include "random_tensors.hpp"

namespace gshard::test {

inline std::string list_text(const Shape& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s.append(i ? "," : "").append(std::to_string(v[i]));
  return s + "]";
}

inline std::string sizes_text(const std::vector<int>& sizes) {
  std::string s;
  for (std::size_t i = 0; i < sizes.size(); ++i)
    s.append(i ? "x" : "").append(std::to_string(sizes[i]));
  return s;
}

template <class T>
MPI_Datatype mpi_type_of() {
  if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else
    return MPI_INT32_T;
}

struct MeshUnderTest {
  std::vector<int> sizes;
  std::vector<std::string> names;
  const gshard::detail::MeshState* state;
};

// Every listed mesh shape for n ranks over MPI_COMM_WORLD, axes "x", "y" (and "z").
struct TestMeshes {
  using M2 = gshard::Mesh<"x", "y">;
  using M3 = gshard::Mesh<"x", "y", "z">;
  std::vector<M2> m2;
  std::vector<M3> m3;
  std::vector<MeshUnderTest> all;
  explicit TestMeshes(int n) {
    const auto shapes = listed_mesh_shapes(n);
    m2.reserve(shapes.size());
    m3.reserve(shapes.size());
    for (const auto& s : shapes) {
      if (s.size() == 2) {
        m2.emplace_back(MPI_COMM_WORLD, std::initializer_list<int>{s[0], s[1]});
        all.push_back({s, {"x", "y"}, &gshard::detail::mesh_state(m2.back())});
      } else {
        m3.emplace_back(MPI_COMM_WORLD, std::initializer_list<int>{s[0], s[1], s[2]});
        all.push_back({s, {"x", "y", "z"}, &gshard::detail::mesh_state(m3.back())});
      }
    }
  }
};

// "" when no rank threw, else why (collective over MPI_COMM_WORLD; call on every rank).
inline std::string threw_anywhere(const std::string& threw) {
  int any = threw.empty() ? 0 : 1;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!threw.empty()) return "threw: " + threw;
  return any ? "another rank threw" : "";
}

// This rank's block `got` under `l` (global shape `shape`): fills `global_of` (global index of
// each element, -1 for padding) and `sum` (got summed over the partial copies, as S; every copy
// takes part). Returns the first problem: a wrong local size (then nothing is summed) or a
// nonzero padding element; "" when none.
template <class S, class T>
std::string sum_partial_copies(const std::vector<T>& got, const Layout& l, const Shape& shape,
                               const Grid& grid, const gshard::detail::MeshState& mesh,
                               std::vector<Int>& global_of, std::vector<S>& sum) {
  global_of.clear();
  const Int total = for_block(l, shape, grid, [&](Int, Int g) { global_of.push_back(g); });
  if (static_cast<Int>(got.size()) != total)
    return "local size " + std::to_string(got.size()) + ", expected " + std::to_string(total);
  std::string wrong;
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
    if (global_of[i] < 0 && got[i] != T{})
      wrong = "padding element " + std::to_string(i) + " holds " + std::to_string(got[i]);
  const unsigned mask = gshard::detail::partial_mask(l);
  sum.assign(got.begin(), got.end());
  if (mask != 0)
    MPI_Allreduce(MPI_IN_PLACE, sum.data(), static_cast<int>(sum.size()), mpi_type_of<S>(), MPI_SUM,
                  mesh.groups[mask]);
  return wrong;
}

// The mesh axes that split `label` in `l`, major first (none when not a label of l).
inline std::vector<int> axes_of(const Layout& l, char label) {
  const int d = find_label(l, label);
  std::vector<int> out;
  if (d >= 0)
    for (int i = 0; i < l.dims[d].axis_count; ++i)
      out.push_back(l.dims[d].axes[static_cast<std::size_t>(i)]);
  return out;
}

// A random operand: 1 to 4 labels of A-Z, sizes mostly 1 to 9, a random layout over
// `axis_count` axes; `split` and `other` hold its split and unsplit labels, shuffled.
struct RandomOperand {
  std::string labels;
  Shape shape;
  Layout layout;
  std::string split, other;
};

inline RandomOperand random_operand(Dice& dice, int axis_count) {
  RandomOperand o;
  std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  dice.shuffle(pool);
  const int rank = dice.between(1, 4);
  o.labels = pool.substr(0, static_cast<std::size_t>(rank));
  for (int d = 0; d < rank; ++d)
    o.shape.push_back(dice.chance(30) ? dice.between(1, 3) : dice.between(1, 9));
  o.layout = random_layout(dice, o.labels, axis_count, {});
  for (int d = 0; d < rank; ++d)
    (o.layout.dims[d].axis_count > 0 ? o.split : o.other) += o.layout.dims[d].label;
  dice.shuffle(o.split);
  dice.shuffle(o.other);
  return o;
}

// Element types of the typed property cases, with values exact in each.
enum class Kind { f64, f32, i64, i32 };

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::f64:
      return "double";
    case Kind::f32:
      return "float";
    case Kind::i64:
      return "int64";
    case Kind::i32:
      return "int32";
  }
  return "?";
}

inline int bits_of(Kind k) { return k == Kind::f64 ? 10 : k == Kind::f32 ? 2 : 0; }

inline std::vector<double> global_values(Int n, std::uint64_t salt, Kind k) {
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = dyadic(mix(salt * 7919ULL + i), 4, bits_of(k));
  return g;
}

// This rank's padded shard of `global`; a partial layout splits each value into summands
// part(g, j) for partial copies j > 0 (copy 0 holds the rest), computed in V.
template <class T, class V, class Part>
std::vector<T> split_shard(const Layout& l, const Shape& shape, const std::vector<V>& global,
                           const Grid& grid, Part&& part) {
  int copies = 1, q = 0;
  for (int i = 0; i < l.partial_count; ++i) {
    const auto a = static_cast<std::size_t>(l.partial[static_cast<std::size_t>(i)]);
    copies *= grid.sizes[a];
    q = q * grid.sizes[a] + grid.coords[a];
  }
  std::vector<T> out;
  for_block(l, shape, grid, [&](Int i, Int g) {
    if (static_cast<Int>(out.size()) <= i) out.resize(static_cast<std::size_t>(i) + 1, T{});
    if (g < 0) return;
    V v = global[static_cast<std::size_t>(g)];
    if (copies > 1) {
      if (q != 0) {
        v = part(g, q);
      } else {
        for (int j = 1; j < copies; ++j) v -= part(g, j);
      }
    }
    out[static_cast<std::size_t>(i)] = static_cast<T>(v);
  });
  return out;
}

// split_shard with random summands in the element type's grid.
template <class T>
std::vector<T> kind_shard(const Layout& l, const Shape& shape, const std::vector<double>& global,
                          const Grid& grid, std::uint64_t salt, Kind k) {
  return split_shard<T>(l, shape, global, grid, [&](Int g, int j) {
    return dyadic(
        mix(salt ^ mix(static_cast<std::uint64_t>(g) * 64 + static_cast<std::uint64_t>(j))), 2,
        bits_of(k));
  });
}

}  // namespace gshard::test
