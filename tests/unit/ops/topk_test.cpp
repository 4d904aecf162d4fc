// top_k and one_hot (ops/topk.hpp), property-based: random tensors, layouts (the selected label
// split over one or several axes, replicated, partial copies that must be finished first),
// uneven sizes, ties and element types through gshard::detail::top_k_runtime and
// one_hot_runtime, against naive loops over the global values; each case also checks the exact
// communication (finishing a partial sum as the reshard planner plans it, then exactly two
// AllGathers of k candidates per line and shard: values and indices). Then typed cases, counter
// tests and errors.
//
// Shards are built by the test's own block arithmetic (tests/support); values are small
// integers (many ties) or dyadic rationals, so every partial sum is exact and results are
// compared exactly.
#include "mpi_test.hpp"
// clang-format off
#include <gshard/ops/topk.hpp>
// clang-format on

#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::test::Dice;
using gshard::test::for_block;
using gshard::test::global_values;
using gshard::test::Grid;
using gshard::test::grid_of;
using gshard::test::Kind;
using gshard::test::kind_name;
using gshard::test::kind_shard;
using gshard::test::layout_text;
using gshard::test::list_text;
using gshard::test::mix;
using gshard::test::sizes_text;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

// Small integers in [-3, 3]: many ties, so the order of equal values is tested.
std::vector<double> tie_values(Int n, std::uint64_t salt) {
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = gshard::test::dyadic(mix(salt * 104729ULL + i), 3, 0);
  return g;
}

Int stride_after(const Shape& shape, std::size_t d) {
  Int s = 1;
  for (std::size_t e = d + 1; e < shape.size(); ++e) s *= shape[e];
  return s;
}

// The naive top k: for each line along dimension d, indices sorted by value descending, ties by
// smaller index; the result row-major with d replaced by k.
std::pair<std::vector<double>, std::vector<Int>> naive_top_k(const std::vector<double>& g,
                                                             const Shape& shape, std::size_t d,
                                                             Int k) {
  const Int inner = stride_after(shape, d);
  const Int n = shape[d];
  const Int outer = gshard::detail::product(shape) / std::max<Int>(1, n * inner);
  std::vector<double> v(static_cast<std::size_t>(outer * k * inner));
  std::vector<Int> ix(v.size());
  for (Int o = 0; o < outer; ++o)
    for (Int i = 0; i < inner; ++i) {
      std::vector<Int> order(static_cast<std::size_t>(n));
      for (Int j = 0; j < n; ++j) order[static_cast<std::size_t>(j)] = j;
      auto at = [&](Int j) { return g[static_cast<std::size_t>((o * n + j) * inner + i)]; };
      // Ties by position: std::sort, since clang 19 flags stable_sort's buffer in libstdc++ 12.
      std::sort(order.begin(), order.end(),
                [&](Int a, Int b) { return at(a) > at(b) || (at(a) == at(b) && a < b); });
      for (Int j = 0; j < k; ++j) {
        const auto out = static_cast<std::size_t>((o * k + j) * inner + i);
        v[out] = at(order[static_cast<std::size_t>(j)]);
        ix[out] = order[static_cast<std::size_t>(j)];
      }
    }
  return {v, ix};
}

// Collectives that finishing x's partial sums runs (the planner's own steps and bytes).
gshard::CommCount finishing(const Layout& l, const Shape& shape,
                            const gshard::detail::MeshState& mesh,
                            const std::vector<std::string>& names, Int elem) {
  gshard::CommCount c;
  if (l.partial_count == 0) return c;
  Layout need = l;
  need.partial_count = 0;
  const gshard::ReshardPlan p =
      gshard::detail::plan_reshard(l, need, shape, mesh.sizes, mesh.coords, names, elem);
  for (const auto& s : p.steps)
    if (s.kind != gshard::StepKind::local && s.kind != gshard::StepKind::make_partial) ++c.calls;
  c.bytes = p.bytes();
  return c;
}

// The axes of size > 1 that split dimension d, as the counters name them, and their shard count.
std::pair<std::string, int> split_axes(const Layout& l, int d, const std::vector<int>& sizes,
                                       const std::vector<std::string>& names) {
  std::vector<int> axes;
  for (int i = 0; i < l.dims[d].axis_count; ++i) {
    const int a = l.dims[d].axes[static_cast<std::size_t>(i)];
    if (sizes[static_cast<std::size_t>(a)] > 1) axes.push_back(a);
  }
  std::sort(axes.begin(), axes.end());
  std::string s;
  int k = 1;
  for (int a : axes) {
    s.append(s.empty() ? "" : "*").append(names[static_cast<std::size_t>(a)]);
    k *= sizes[static_cast<std::size_t>(a)];
  }
  return {s, k};
}

// Padded local extents of every dimension but `skip`, multiplied.
Int other_extents(const Layout& l, const Shape& shape, int skip, const std::vector<int>& sizes) {
  Int lines = 1;
  for (int d = 0; d < l.rank; ++d) {
    if (d == skip) continue;
    Int shards = 1;
    for (int i = 0; i < l.dims[d].axis_count; ++i)
      shards *= sizes[static_cast<std::size_t>(l.dims[d].axes[static_cast<std::size_t>(i)])];
    lines *= (shape[static_cast<std::size_t>(d)] + shards - 1) / shards;
  }
  return lines;
}

struct Case {
  std::vector<int> sizes;
  std::vector<std::string> names;
  std::string labels;
  char label = 0;      // top_k: the label selected over
  char new_label = 0;  // K (top_k) or E (one_hot)
  Shape shape;
  Layout layout;
  Kind kind = Kind::f64;
  bool ties = false;
  Int k = 1;  // top_k: k; one_hot: size
  std::uint64_t salt = 0;
};

Case random_case(Dice& dice, const std::vector<int>& sizes, const std::vector<std::string>& names,
                 std::uint64_t salt, bool one_hot) {
  Case c;
  c.sizes = sizes;
  c.names = names;
  c.salt = salt;
  std::string pool = "ABCDSTUVK";
  dice.shuffle(pool);
  c.labels = pool.substr(0, static_cast<std::size_t>(dice.between(1, 3)));
  c.new_label = pool[c.labels.size()];
  c.label = c.labels[static_cast<std::size_t>(dice.below(static_cast<int>(c.labels.size())))];
  c.kind = one_hot ? (dice.chance(50) ? Kind::i64 : Kind::i32) : static_cast<Kind>(dice.below(4));
  c.ties = dice.chance(50);
  for (char l : c.labels)
    c.shape.push_back(!one_hot && l == c.label ? dice.between(1, 12) : dice.between(1, 5));
  std::map<char, std::vector<int>> fixed;
  if (!one_hot && dice.chance(60)) {
    std::vector<int> axes;
    for (int a = 0; a < static_cast<int>(sizes.size()); ++a)
      if (dice.chance(55)) axes.push_back(a);
    if (axes.empty()) axes.push_back(dice.below(static_cast<int>(sizes.size())));
    dice.shuffle(axes);
    fixed[c.label] = axes;
  }
  c.layout = gshard::test::random_layout(dice, c.labels, static_cast<int>(sizes.size()), fixed);
  if (one_hot) {
    c.k = dice.between(1, 6);
  } else {
    const Int n = c.shape[static_cast<std::size_t>(gshard::test::find_label(c.layout, c.label))];
    c.k = dice.chance(30) ? n : dice.between(1, static_cast<int>(n));
  }
  return c;
}

std::string describe(const Case& c, int index, bool one_hot) {
  std::ostringstream s;
  s << "case #" << index << ": mesh " << sizes_text(c.sizes) << ", " << kind_name(c.kind) << ", ";
  if (one_hot)
    s << "one_hot<'" << c.new_label << "'>(size " << c.k << ")";
  else
    s << "top_k<'" << c.label << "', '" << c.new_label << "'>(k " << c.k << ")"
      << (c.ties ? " with ties" : "");
  s << ", input \"" << layout_text(c.layout, c.names) << "\" shape " << list_text(c.shape)
    << ", salt " << c.salt;
  return s.str();
}

struct Tally {
  int cases = 0, failures = 0, split = 0, partial = 0, ties = 0, out_of_range = 0;
};

template <class T>
std::string run_top_k(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid,
                      Tally& tally) {
  const Int total = gshard::detail::product(c.shape);
  const std::vector<double> g =
      c.ties ? tie_values(total, c.salt) : global_values(total, c.salt, c.kind);
  const gshard::detail::RuntimeTensor<T> x{
      c.layout, c.shape,
      gshard::test::device_copy(kind_shard<T>(c.layout, c.shape, g, grid, c.salt ^ 0x7777, c.kind)),
      gshard::ReduceOp::sum};
  const int d = gshard::test::find_label(c.layout, c.label);
  const auto du = static_cast<std::size_t>(d);
  Layout want_layout = c.layout;  // the test's own statement of the rule
  want_layout.dims[du] = gshard::DimLayout{};
  want_layout.dims[du].label = c.new_label;
  want_layout.partial_count = 0;
  want_layout.partial = {};
  Shape want_shape = c.shape;
  want_shape[du] = c.k;
  const gshard::CommCount finish = finishing(c.layout, c.shape, mesh, c.names, Int{sizeof(T)});
  const auto [axes, shards] = split_axes(c.layout, d, c.sizes, c.names);
  const Int lines = other_extents(c.layout, c.shape, d, c.sizes);

  gshard::comm_counters().reset();
  std::pair<gshard::detail::RuntimeTensor<T>, gshard::detail::RuntimeTensor<Int>> r;
  std::string threw;
  try {
    r = gshard::detail::top_k_runtime<T>(x, c.label, c.new_label, c.k, mesh, c.names);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  tally.split += shards > 1 ? 1 : 0;
  tally.partial += c.layout.partial_count > 0 ? 1 : 0;
  tally.ties += c.ties ? 1 : 0;

  std::string wrong;
  const gshard::CommCount total_c = gshard::comm_counters().total();
  const gshard::CommCount gathers =
      gshard::comm_counters().get(axes, gshard::Collective::all_gather);
  const Int want_gather_bytes = (shards - 1) * lines * c.k * Int{sizeof(T) + sizeof(Int)};
  if (!(r.first.layout == want_layout) || !(r.second.layout == want_layout))
    wrong = "result layout \"" + layout_text(r.first.layout, c.names) + "\", expected \"" +
            layout_text(want_layout, c.names) + "\"";
  else if (r.first.shape != want_shape || r.second.shape != want_shape)
    wrong = "result shape " + list_text(r.first.shape);
  else if (total_c.calls != finish.calls + (shards > 1 ? 2 : 0))
    wrong = std::to_string(total_c.calls) + " collectives ran, expected " +
            std::to_string(finish.calls) + " to finish partials and " +
            (shards > 1 ? "2 AllGathers" : "none else");
  else if (shards > 1 && (gathers.calls != 2 || gathers.bytes != want_gather_bytes))
    wrong = "AllGathers over " + axes + ": " + std::to_string(gathers.calls) + " calls, " +
            std::to_string(gathers.bytes) + " bytes, expected 2 calls, " +
            std::to_string(want_gather_bytes) + " bytes";
  else if (total_c.bytes != finish.bytes + (shards > 1 ? want_gather_bytes : 0))
    wrong = "counted " + std::to_string(total_c.bytes) + " bytes in all";
  if (!wrong.empty()) return wrong;

  const auto [ref_v, ref_i] = naive_top_k(g, c.shape, du, c.k);
  const std::vector<T> got_v = gshard::test::host_copy(r.first.data);
  const std::vector<Int> got_i = gshard::test::host_copy(r.second.data);
  std::vector<Int> global_of;
  const Int n =
      for_block(want_layout, want_shape, grid, [&](Int, Int gi) { global_of.push_back(gi); });
  if (static_cast<Int>(got_v.size()) != n || static_cast<Int>(got_i.size()) != n)
    return "local size " + std::to_string(got_v.size()) + ", expected " + std::to_string(n);
  for (std::size_t i = 0; i < got_v.size(); ++i) {
    const Int gi = global_of[i];
    const double want_v = gi < 0 ? 0.0 : ref_v[static_cast<std::size_t>(gi)];
    const Int want_i = gi < 0 ? 0 : ref_i[static_cast<std::size_t>(gi)];
    if (static_cast<double>(got_v[i]) != want_v || got_i[i] != want_i) {
      std::ostringstream s;
      s << "local element " << i << (gi < 0 ? " (padding)" : " (global " + std::to_string(gi) + ")")
        << " is " << static_cast<double>(got_v[i]) << " at index " << got_i[i] << ", expected "
        << want_v << " at index " << want_i;
      return s.str();
    }
  }
  return "";
}

template <class I, class V>
std::string run_one_hot(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid,
                        Tally& tally) {
  const Int total = gshard::detail::product(c.shape);
  std::vector<double> g(static_cast<std::size_t>(total));
  for (std::size_t i = 0; i < g.size(); ++i)  // some indices outside [0, size)
    g[i] = static_cast<double>(
        static_cast<Int>(mix(c.salt * 31337ULL + i) % static_cast<std::uint64_t>(c.k + 4)) - 2);
  const gshard::detail::RuntimeTensor<I> x{
      c.layout, c.shape,
      gshard::test::device_copy(kind_shard<I>(c.layout, c.shape, g, grid, c.salt ^ 0x3333, c.kind)),
      gshard::ReduceOp::sum};
  Layout want_layout = c.layout;
  want_layout.partial_count = 0;
  want_layout.partial = {};
  want_layout.dims[static_cast<std::size_t>(want_layout.rank)] = gshard::DimLayout{};
  want_layout.dims[static_cast<std::size_t>(want_layout.rank)].label = c.new_label;
  ++want_layout.rank;
  Shape want_shape = c.shape;
  want_shape.push_back(c.k);
  const gshard::CommCount finish = finishing(c.layout, c.shape, mesh, c.names, Int{sizeof(I)});
  gshard::comm_counters().reset();
  gshard::detail::RuntimeTensor<V> r;
  std::string threw;
  try {
    r = gshard::detail::one_hot_runtime<V, I>(x, c.new_label, c.k, mesh, c.names);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  tally.partial += c.layout.partial_count > 0 ? 1 : 0;
  for (double v : g) tally.out_of_range += (v < 0 || v >= static_cast<double>(c.k)) ? 1 : 0;
  const gshard::CommCount counted = gshard::comm_counters().total();
  if (!(r.layout == want_layout))
    return "result layout \"" + layout_text(r.layout, c.names) + "\", expected \"" +
           layout_text(want_layout, c.names) + "\"";
  if (r.shape != want_shape) return "result shape " + list_text(r.shape);
  if (counted.calls != finish.calls || counted.bytes != finish.bytes)
    return "counted " + std::to_string(counted.calls) + " collectives, " +
           std::to_string(counted.bytes) + " bytes; finishing the partial sums plans " +
           std::to_string(finish.calls) + ", " + std::to_string(finish.bytes);
  const std::vector<V> got = gshard::test::host_copy(r.data);
  std::vector<Int> global_of;
  const Int n =
      for_block(want_layout, want_shape, grid, [&](Int, Int gi) { global_of.push_back(gi); });
  if (static_cast<Int>(got.size()) != n) return "local size " + std::to_string(got.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const Int gi = global_of[i];
    const V want = gi >= 0 && static_cast<Int>(g[static_cast<std::size_t>(gi / c.k)]) == gi % c.k
                       ? V(1)
                       : V(0);
    if (got[i] != want)
      return "local element " + std::to_string(i) + " (global " + std::to_string(gi) + ") is " +
             std::to_string(got[i]) + ", expected " + std::to_string(want);
  }
  return "";
}

}  // namespace

TEST_CASE(
    "top_k (run-time engine): random layouts, sizes, ties, types and meshes vs a naive loop") {
  const int n = world_size();
  const gshard::test::TestMeshes meshes(n);
  const int per_mesh =
      (200 + static_cast<int>(meshes.all.size()) - 1) / static_cast<int>(meshes.all.size());
  Dice dice(424242);
  Tally t;
  int reported = 0;
  for (const auto& [sizes, names, state] : meshes.all) {
    const Grid grid = grid_of(sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c =
          random_case(dice, sizes, names, static_cast<std::uint64_t>(t.cases) + 1, false);
      std::string wrong;
      switch (c.kind) {
        case Kind::f64:
          wrong = run_top_k<double>(c, *state, grid, t);
          break;
        case Kind::f32:
          wrong = run_top_k<float>(c, *state, grid, t);
          break;
        case Kind::i64:
          wrong = run_top_k<std::int64_t>(c, *state, grid, t);
          break;
        case Kind::i32:
          wrong = run_top_k<std::int32_t>(c, *state, grid, t);
          break;
      }
      if (!wrong.empty()) {
        ++t.failures;
        if (reported++ < 8)
          FAIL_CHECK(describe(c, t.cases, false)
                     << " at " << n << " ranks, rank " << world_rank() << ": " << wrong);
      }
      ++t.cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(t.cases << " random top_k over " << meshes.all.size() << " meshes: " << t.split
                    << " over a split label, " << t.partial << " partial, " << t.ties
                    << " with many ties");
  CHECK(t.cases >= 100);
  CHECK(t.failures == 0);
  if (n >= 2) CHECK(t.split > 0);
  CHECK(t.partial > 0);
}

TEST_CASE("one_hot (run-time engine): random layouts, sizes and meshes vs a naive loop") {
  const int n = world_size();
  const gshard::test::TestMeshes meshes(n);
  const int per_mesh =
      (150 + static_cast<int>(meshes.all.size()) - 1) / static_cast<int>(meshes.all.size());
  Dice dice(171717);
  Tally t;
  int reported = 0;
  for (const auto& [sizes, names, state] : meshes.all) {
    const Grid grid = grid_of(sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, sizes, names, static_cast<std::uint64_t>(t.cases) + 1, true);
      const int v = t.cases % 3;
      std::string wrong;
      if (c.kind == Kind::i64)
        wrong = v == 0   ? run_one_hot<std::int64_t, float>(c, *state, grid, t)
                : v == 1 ? run_one_hot<std::int64_t, double>(c, *state, grid, t)
                         : run_one_hot<std::int64_t, std::int32_t>(c, *state, grid, t);
      else
        wrong = v == 0   ? run_one_hot<std::int32_t, float>(c, *state, grid, t)
                : v == 1 ? run_one_hot<std::int32_t, double>(c, *state, grid, t)
                         : run_one_hot<std::int32_t, std::int64_t>(c, *state, grid, t);
      if (!wrong.empty()) {
        ++t.failures;
        if (reported++ < 8)
          FAIL_CHECK(describe(c, t.cases, true)
                     << " at " << n << " ranks, rank " << world_rank() << ": " << wrong);
      }
      ++t.cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(t.cases << " random one_hot over " << meshes.all.size() << " meshes: " << t.partial
                    << " with partial indices, " << t.out_of_range << " indices out of range");
  CHECK(t.cases >= 100);
  CHECK(t.failures == 0);
  CHECK(t.out_of_range > 0);
}

// --- typed API ----------------------------------------------------------------------------------

namespace {

using M = gshard::Mesh<"x", "y">;

// top_k<"S", "K"> of a typed tensor: the spec the rule gives, values and indices via to_global.
template <gshard::fixed_string Spec>
void typed_top_k(const M& mesh, const Shape& shape, Int k, const std::string& expected_spec,
                 int& cases) {
  using X = gshard::Sharded<double, M, Spec>;
  const std::vector<double> g =
      tie_values(gshard::detail::product(shape), 900 + static_cast<std::uint64_t>(cases));
  const X x = gshard::from_global<X>(mesh, shape, g);
  const auto d = static_cast<std::size_t>(X::layout.find('S'));
  INFO("top_k<\"S\", \"K\">(\"" << std::string(Spec.view()) << "\" shape " << list_text(shape)
                                << ", k " << k << ") on mesh " << mesh.describe());
  const auto r = gshard::top_k<"S", "K">(x, k);
  CHECK(std::string(decltype(r.values)::spec.view()) == expected_spec);
  CHECK(std::string(decltype(r.indices)::spec.view()) == expected_spec);
  static_assert(std::is_same_v<typename decltype(r.indices)::value_type, std::int64_t>);
  const auto [v, i] = naive_top_k(g, shape, d, k);
  CHECK(r.values.to_global() == v);
  CHECK(r.indices.to_global() == i);
  // A lazy input is evaluated first.
  const auto twice = gshard::top_k<"S", "K">(x + x, k);
  std::vector<double> v2 = v;
  for (double& e : v2) e *= 2;
  CHECK(twice.values.to_global() == v2);
  CHECK(twice.indices.to_global() == i);
  ++cases;
}

}  // namespace

TEST_CASE("top_k<\"S\", \"K\">() and one_hot<\"E\">(): typed cases on every 2-axis mesh") {
  const int n = world_size();
  int cases = 0;
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    typed_top_k<"B:x S:y">(mesh, {3, 11}, 4, "B:x K", cases);
    typed_top_k<"S:y*x B">(mesh, {13, 2}, 3, "K B", cases);
    typed_top_k<"S B:y">(mesh, {5, 3}, 5, "K B:y", cases);  // k = the whole label
    // Long lines: k at a merge list's capacity (the team path) and one past it (a thread a line).
    typed_top_k<"B:x S:y">(mesh, {3, 301}, 8, "B:x K", cases);
    typed_top_k<"B:x S:y">(mesh, {2, 45}, 9, "B:x K", cases);
    typed_top_k<"B S:x +y">(mesh, {2, 3}, 1, "B K", cases);  // partial finished; empty shards
    // Pending max partials (every copy the full value) are finished with max.
    {
      using P = gshard::Sharded<double, M, "B S:x +y">;
      using Q = gshard::Sharded<double, M, "B S:x">;
      const Shape shape{3, 7};
      const std::vector<double> g = tie_values(21, 77);
      const Q q = gshard::from_global<Q>(mesh, shape, g);
      P p(mesh, shape, q.local_view());
      gshard::detail::set_partial_op(p, gshard::ReduceOp::max);
      const auto r = gshard::top_k<"S", "K">(p, 2);
      const auto [v, i] = naive_top_k(g, shape, 1, 2);
      CHECK(r.values.to_global() == v);
      CHECK(r.indices.to_global() == i);
    }
    // one_hot: E appended, unsplit; out-of-range indices give zero rows.
    {
      using I = gshard::Sharded<std::int64_t, M, "B:x T:y">;
      const Shape shape{3, 5};
      std::vector<std::int64_t> g(15);
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = static_cast<std::int64_t>(j % 7) - 1;
      const I idx = gshard::from_global<I>(mesh, shape, g);
      const auto f = gshard::one_hot<"E">(idx, 5);
      const auto dd = gshard::one_hot<"E", double>(idx, 5);
      static_assert(std::is_same_v<typename decltype(f)::value_type, float>);
      static_assert(std::is_same_v<typename decltype(dd)::value_type, double>);
      CHECK(std::string(decltype(f)::spec.view()) == "B:x T:y E");
      std::vector<double> want(75, 0.0);
      for (std::size_t j = 0; j < g.size(); ++j)
        if (g[j] >= 0 && g[j] < 5) want[j * 5 + static_cast<std::size_t>(g[j])] = 1.0;
      const std::vector<float> gf = f.to_global();
      CHECK(std::vector<double>(gf.begin(), gf.end()) == want);
      CHECK(dd.to_global() == want);
    }
    ++cases;
  }
  CHECK(cases >= 5);
}

TEST_CASE("top_k over a split label: exactly two AllGathers of k candidates per line and shard") {
  const int n = world_size();
  {
    const M mesh(MPI_COMM_WORLD, {1, n});
    using X = gshard::Sharded<double, M, "B S:y">;
    const Shape shape{3, 2 * n + 1};
    const std::vector<double> g = tie_values(3 * (2 * n + 1), 5);
    const X x = gshard::from_global<X>(mesh, shape, g);
    gshard::comm_counters().reset();
    const auto r = gshard::top_k<"S", "K">(x, 2);
    const gshard::CommCount total = gshard::comm_counters().total();
    const gshard::CommCount ag = gshard::comm_counters().get("y", gshard::Collective::all_gather);
    CHECK(total.calls == (n > 1 ? 2 : 0));
    CHECK(ag.calls == (n > 1 ? 2 : 0));
    // 3 lines x k=2 candidates, 8-byte values and 8-byte indices, from each of n shards.
    CHECK(ag.bytes == (n - 1) * 3 * 2 * (8 + 8));
    CHECK(total.bytes == ag.bytes);
    const auto [v, i] = naive_top_k(g, shape, 1, 2);
    CHECK(r.values.to_global() == v);
    CHECK(r.indices.to_global() == i);
    // Over an unsplit label, and one_hot: no communication.
    using U = gshard::Sharded<double, M, "B:y S">;
    const U u = gshard::from_global<U>(mesh, shape, g);
    gshard::comm_counters().reset();
    const auto s = gshard::top_k<"S", "K">(u, 3);
    using I = gshard::Sharded<std::int32_t, M, "B S:y">;
    const auto h = gshard::one_hot<"E">(gshard::full<I>(mesh, shape, 1), 4);
    CHECK(gshard::comm_counters().total().calls == 0);
    CHECK(std::string(decltype(s.values)::spec.view()) == "B:y K");
    CHECK(std::string(decltype(h)::spec.view()) == "B S:y E");
  }
  if (n >= 4) {
    const M mesh(MPI_COMM_WORLD, {2, n / 2});
    using X = gshard::Sharded<float, M, "S:y*x B">;
    const Shape shape{2 * n + 3, 3};
    const std::vector<double> g = tie_values((2 * n + 3) * 3, 6);
    std::vector<float> gf(g.begin(), g.end());
    const X x = gshard::from_global<X>(mesh, shape, gf);
    gshard::comm_counters().reset();
    const auto r = gshard::top_k<"S", "K">(x, 4);
    const gshard::CommCount ag = gshard::comm_counters().get("x*y", gshard::Collective::all_gather);
    CHECK(gshard::comm_counters().total().calls == 2);
    CHECK(ag.calls == 2);
    CHECK(ag.bytes == (n - 1) * 3 * 4 * (4 + 8));
    const auto [v, i] = naive_top_k(g, shape, 0, 4);
    const std::vector<float> got = r.values.to_global();
    CHECK(std::vector<double>(got.begin(), got.end()) == v);
    CHECK(r.indices.to_global() == i);
  }
}

TEST_CASE("top_k / one_hot errors: bad k, unknown or taken labels, bad size, on every rank") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  const std::vector<std::string> names{"x", "y"};
  using X = gshard::Sharded<double, M, "B S:y">;
  const X x = gshard::full<X>(mesh, {2, 5}, 1.0);
  using I = gshard::Sharded<std::int64_t, M, "B S:y">;
  const I idx = gshard::full<I>(mesh, {2, 5}, 1);
  auto message_of = [](auto&& f) {
    std::string m;
    try {
      f();
    } catch (const gshard::Error& e) {
      m = e.what();
    }
    return m;
  };
  auto everywhere = [&](const std::string& message, const std::string& needle) {
    INFO(message);
    int has = message.find(needle) != std::string::npos ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &has, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(has == n);
  };
  gshard::comm_counters().reset();
  everywhere(
      message_of([&] { (void)gshard::top_k<"S", "K">(x, 0); }),
      "gshard::top_k: k = 0 over 'S' of \"B S:y\" (global shape [2, 5]): k must be in [1, 5]");
  everywhere(message_of([&] { (void)gshard::top_k<"S", "K">(x, 6); }), "k = 6 over 'S'");
  const auto rx = gshard::detail::runtime_tensor(x);
  everywhere(message_of([&] {
               (void)gshard::detail::top_k_runtime(rx, 'Q', 'K', 1,
                                                   gshard::detail::mesh_state(mesh), names);
             }),
             "gshard::top_k: label 'Q' is not in the input");
  everywhere(message_of([&] {
               (void)gshard::detail::top_k_runtime(rx, 'S', 'B', 1,
                                                   gshard::detail::mesh_state(mesh), names);
             }),
             "gshard::top_k: the new label 'B' is already a label of the input");
  everywhere(message_of([&] { (void)gshard::one_hot<"E">(idx, 0); }),
             "gshard::one_hot: size 0 of 'E' for indices \"B S:y\" (global shape [2, 5])");
  const auto ri = gshard::detail::runtime_tensor(idx);
  everywhere(message_of([&] {
               (void)gshard::detail::one_hot_runtime<float>(
                   ri, 'S', 3, gshard::detail::mesh_state(mesh), names);
             }),
             "gshard::one_hot: the new label 'S' for indices \"B S:y\"");
  CHECK(gshard::comm_counters().total().calls == 0);  // every check precedes communication
}
