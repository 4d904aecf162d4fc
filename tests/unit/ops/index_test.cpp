// Index ops (ops/index.hpp), property-based: random take<"V"> and scatter_add<"V"> cases through
// the run-time engines (detail::take_runtime, detail::scatter_add_runtime) with random layouts of
// both operands (split, replicated, pending partial sums, several axes per label), uneven sizes,
// int32 and int64 indices, float and double, on every listed mesh shape at this rank count, each
// checked against a naive loop over the global arrays; then the communication of the embedding
// lookup (Megatron: none until finished, then one AllReduce), typed cases whose result specs are
// written by hand from the rules, and errors (out-of-range indices, sizes that disagree).
//
// Shards are built by the tests' own block arithmetic (block_reference.hpp); a partial operand's
// global value is split into random summands over its partial coordinates (integers for the
// indices). Values are dyadic, so every sum here is exact and results are compared exactly.
#include <algorithm>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"
// The header under test, after mpi_test.hpp.
#include <gshard/ops/index.hpp>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::test::axes_of;
using gshard::test::device_copy;
using gshard::test::Dice;
using gshard::test::find_label;
using gshard::test::for_block;
using gshard::test::Grid;
using gshard::test::grid_of;
using gshard::test::host_copy;
using gshard::test::layout_text;
using gshard::test::list_text;
using gshard::test::MeshUnderTest;
using gshard::test::mix;
using gshard::test::random_global;
using gshard::test::random_layout;
using gshard::test::shard_of;
using gshard::test::sizes_text;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

Int product(const Shape& s) {
  Int p = 1;
  for (Int v : s) p *= v;
  return p;
}

// Row-major strides of `labels` with `shape`, by label.
std::map<char, Int> strides_of(const std::string& labels, const Shape& shape) {
  std::map<char, Int> st;
  Int s = 1;
  for (std::size_t d = labels.size(); d-- > 0;) {
    st[labels[d]] = s;
    s *= shape[d];
  }
  return st;
}

// Calls f(global linear index, per-label coordinates) for every element of `labels`/`shape`.
template <class F>
void for_each_global(const std::string& labels, const Shape& shape, F&& f) {
  const Int total = product(shape);
  std::map<char, Int> at;
  for (Int g = 0; g < total; ++g) {
    Int rest = g;
    for (std::size_t d = labels.size(); d-- > 0;) {
      at[labels[d]] = rest % shape[d];
      rest /= shape[d];
    }
    f(g, at);
  }
}

// This rank's shard of integer `global` under `l`; a partial layout gets integer summands
// (random in [-3, 3] on copies other than the first, the rest on the first).
template <class I>
std::vector<I> int_shard(const Layout& l, const Shape& shape, const std::vector<Int>& global,
                         const Grid& grid, std::uint64_t salt) {
  return gshard::test::split_shard<I>(l, shape, global, grid, [&](Int g, int j) {
    return static_cast<Int>(
               mix(salt ^ mix(static_cast<std::uint64_t>(g) * 64 + static_cast<std::uint64_t>(j))) %
               7) -
           3;
  });
}

// The result's local block against the reference: padding zero on every copy, then (summed over
// the partial axes) every element equal to the reference.
template <class T>
std::string check_block(const std::vector<T>& got, const Layout& l, const Shape& shape,
                        const std::vector<double>& ref, const Grid& grid,
                        const gshard::detail::MeshState& mesh) {
  std::vector<Int> global_of;
  std::vector<T> sum;
  std::string wrong = gshard::test::sum_partial_copies(got, l, shape, grid, mesh, global_of, sum);
  for (std::size_t i = 0; i < sum.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const auto g = static_cast<std::size_t>(global_of[i]);
    if (static_cast<double>(sum[i]) != ref[g]) {
      std::ostringstream s;
      s << "local element " << i << " (global " << g << ")"
        << (l.partial_count > 0 ? " summed over copies" : "") << " is "
        << static_cast<double>(sum[i]) << ", expected " << ref[g];
      wrong = s.str();
    }
  }
  return wrong;
}

// The bytes of the bounds check: one AllReduce of 3 int64 over the non-trivial axes that split
// the indices (as the rule leaves them), or nothing.
Int check_bytes(const Layout& idx, const std::vector<int>& sizes, Int& calls) {
  int k = 1;
  for (int d = 0; d < idx.rank; ++d)
    for (int i = 0; i < idx.dims[d].axis_count; ++i)
      k *= sizes[static_cast<std::size_t>(idx.dims[d].axes[static_cast<std::size_t>(i)])];
  if (k == 1) return 0;
  ++calls;
  return 2 * (k - 1) * 3 * 8 / k;
}

// --- take ---------------------------------------------------------------------------------------

struct TakeCase {
  std::vector<int> sizes;
  std::vector<std::string> names;
  bool single = false, wide = false;  // float values; int64 indices
  char v = 'V';
  std::string t_labels, i_labels;
  Shape t_shape, i_shape;
  Layout t_layout, i_layout;
  std::uint64_t salt = 0;
};

Layout replicated_layout(Dice& dice, const std::string& labels, int axis_count) {
  Layout l = random_layout(dice, labels, 0, {});
  for (int a = 0; a < axis_count; ++a)
    if (dice.chance(20)) l.partial[static_cast<std::size_t>(l.partial_count++)] = a;
  return l;
}

TakeCase random_take(Dice& dice, const MeshUnderTest& m, std::uint64_t salt) {
  std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  dice.shuffle(pool);
  std::size_t next = 0;
  TakeCase c;
  c.sizes = m.sizes;
  c.names = m.names;
  c.salt = salt;
  c.single = dice.chance(30);
  c.wide = dice.chance(50);
  c.v = pool[next++];
  c.t_labels = std::string(1, c.v);
  const int others = dice.between(0, 2);
  for (int i = 0; i < others; ++i) c.t_labels += pool[next++];
  dice.shuffle(c.t_labels);
  const int ni = dice.chance(8) ? 0 : dice.between(1, 3);
  for (int i = 0; i < ni; ++i) c.i_labels += pool[next++];
  const int axes = static_cast<int>(m.sizes.size());
  for (char l : c.t_labels)
    c.t_shape.push_back(l == c.v ? dice.between(1, 11) : dice.between(1, 5));
  for (std::size_t i = 0; i < c.i_labels.size(); ++i) c.i_shape.push_back(dice.between(1, 6));
  c.t_layout = random_layout(dice, c.t_labels, axes, {});
  // Often replicated indices: the embedding lookup with the table split over V (Megatron).
  c.i_layout = dice.chance(40) ? replicated_layout(dice, c.i_labels, axes)
                               : random_layout(dice, c.i_labels, axes, {});
  return c;
}

std::string describe(const TakeCase& c, int index) {
  std::ostringstream s;
  s << "take case #" << index << ": mesh " << sizes_text(c.sizes) << ", "
    << (c.single ? "float" : "double") << " values, " << (c.wide ? "int64" : "int32")
    << " indices, take<\"" << c.v << "\">(table \"" << layout_text(c.t_layout, c.names)
    << "\" shape " << list_text(c.t_shape) << ", indices \"" << layout_text(c.i_layout, c.names)
    << "\" shape " << list_text(c.i_shape) << "), salt " << c.salt;
  return s.str();
}

template <class T, class I>
std::string run_take(const TakeCase& c, const MeshUnderTest& m, const Grid& grid, int& no_comm) {
  const Int n = c.t_shape[static_cast<std::size_t>(find_label(c.t_layout, c.v))];
  const std::vector<double> table = random_global(product(c.t_shape), c.salt, 0, c.single);
  std::vector<Int> ids(static_cast<std::size_t>(product(c.i_shape)));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<Int>(mix(c.salt * 31 + i) % static_cast<std::uint64_t>(n));
  using gshard::detail::RuntimeTensor;
  const RuntimeTensor<T> t{
      c.t_layout, c.t_shape,
      device_copy(shard_of<T>(c.t_layout, c.t_shape, table, grid, c.salt, c.single)),
      gshard::ReduceOp::sum};
  const RuntimeTensor<I> ix{c.i_layout, c.i_shape,
                            device_copy(int_shard<I>(c.i_layout, c.i_shape, ids, grid, c.salt)),
                            gshard::ReduceOp::sum};
  const gshard::detail::TakeLayouts rules =
      gshard::detail::take_layouts(c.t_layout, c.i_layout, c.v);
  Int calls = 0;
  Int planned = gshard::detail::plan_reshard(c.t_layout, rules.table, c.t_shape, m.state->sizes,
                                             m.state->coords, c.names, Int{sizeof(T)})
                    .bytes() +
                gshard::detail::plan_reshard(c.i_layout, rules.indices, c.i_shape, m.state->sizes,
                                             m.state->coords, c.names, Int{sizeof(I)})
                    .bytes();
  planned += check_bytes(rules.indices, c.sizes, calls);
  const bool in_place = c.t_layout == rules.table && c.i_layout == rules.indices;
  gshard::comm_counters().reset();
  RuntimeTensor<T> r;
  std::string threw;
  try {
    r = gshard::detail::take_runtime<T, I>(c.v, *m.state, c.names, t, ix);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  const gshard::CommCount counted = gshard::comm_counters().total();
  // The expected result: labels and shape, and the naive lookup.
  std::string out_labels = c.i_labels;
  Shape out_shape = c.i_shape;
  for (std::size_t d = 0; d < c.t_labels.size(); ++d)
    if (c.t_labels[d] != c.v) {
      out_labels += c.t_labels[d];
      out_shape.push_back(c.t_shape[d]);
    }
  std::string wrong;
  if (!(r.layout == rules.output))
    wrong = "result layout \"" + layout_text(r.layout, c.names) + "\", the rule says \"" +
            layout_text(rules.output, c.names) + "\"";
  std::string got_labels;
  for (int d = 0; d < r.layout.rank; ++d) got_labels += r.layout.dims[d].label;
  if (wrong.empty() && (got_labels != out_labels || r.shape != out_shape))
    wrong = "result labels " + got_labels + " shape " + list_text(r.shape) + ", expected " +
            out_labels + " " + list_text(out_shape);
  if (wrong.empty() && in_place && counted.calls != calls)
    wrong = "operands in place, yet " + std::to_string(counted.calls) + " collectives ran (" +
            std::to_string(calls) + " expected: the bounds check)";
  if (wrong.empty() && counted.bytes != planned)
    wrong = "counters show " + std::to_string(counted.bytes) + " bytes, expected " +
            std::to_string(planned);
  if (in_place) ++no_comm;
  const auto t_st = strides_of(c.t_labels, c.t_shape);
  const auto i_st = strides_of(c.i_labels, c.i_shape);
  std::vector<double> ref(static_cast<std::size_t>(product(out_shape)));
  for_each_global(out_labels, out_shape, [&](Int g, const std::map<char, Int>& at) {
    Int ii = 0, ti = 0;
    for (char l : c.i_labels) ii += at.at(l) * i_st.at(l);
    for (char l : c.t_labels)
      ti += (l == c.v ? ids[static_cast<std::size_t>(ii)] : at.at(l)) * t_st.at(l);
    ref[static_cast<std::size_t>(g)] = table[static_cast<std::size_t>(ti)];
  });
  int usable = got_labels == out_labels && r.shape == out_shape ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (usable) {
    const std::string v = check_block<T>(host_copy(r.data), r.layout, r.shape, ref, grid, *m.state);
    if (wrong.empty()) wrong = v;
  }
  return wrong.empty() ? "" : wrong + " (result \"" + layout_text(r.layout, c.names) + "\")";
}

// --- scatter_add --------------------------------------------------------------------------------

struct ScatterCase {
  std::vector<int> sizes;
  std::vector<std::string> names;
  bool single = false, wide = false;
  char v = 'V';
  Int n = 0;
  std::string x_labels, i_labels;  // values, indices (memory order)
  Shape x_shape, i_shape;
  Layout x_layout, i_layout;
  std::uint64_t salt = 0;
};

ScatterCase random_scatter(Dice& dice, const MeshUnderTest& m, std::uint64_t salt) {
  std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  dice.shuffle(pool);
  std::size_t next = 0;
  ScatterCase c;
  c.sizes = m.sizes;
  c.names = m.names;
  c.salt = salt;
  c.single = dice.chance(30);
  c.wide = dice.chance(50);
  c.v = pool[next++];
  c.n = dice.between(1, 9);
  const int ni = dice.between(1, 3);
  for (int i = 0; i < ni; ++i) c.i_labels += pool[next++];
  c.x_labels = c.i_labels;
  const int others = dice.between(0, 2);
  for (int i = 0; i < others; ++i) c.x_labels += pool[next++];
  dice.shuffle(c.x_labels);
  dice.shuffle(c.i_labels);
  std::map<char, Int> size;
  for (char l : c.x_labels) size[l] = dice.between(1, 6);
  for (char l : c.x_labels) c.x_shape.push_back(size[l]);
  for (char l : c.i_labels) c.i_shape.push_back(size[l]);
  const int axes = static_cast<int>(m.sizes.size());
  c.x_layout = random_layout(dice, c.x_labels, axes, {});
  std::map<char, std::vector<int>> fixed;
  if (dice.chance(50))  // often the indices already match the values: no reshard
    for (char l : c.i_labels) fixed[l] = axes_of(c.x_layout, l);
  c.i_layout = random_layout(dice, c.i_labels, axes, fixed);
  return c;
}

std::string describe(const ScatterCase& c, int index) {
  std::ostringstream s;
  s << "scatter_add case #" << index << ": mesh " << sizes_text(c.sizes) << ", "
    << (c.single ? "float" : "double") << " values, " << (c.wide ? "int64" : "int32")
    << " indices, scatter_add<\"" << c.v << "\">(values \"" << layout_text(c.x_layout, c.names)
    << "\" shape " << list_text(c.x_shape) << ", indices \"" << layout_text(c.i_layout, c.names)
    << "\" shape " << list_text(c.i_shape) << ", " << c.n << "), salt " << c.salt;
  return s.str();
}

template <class T, class I>
std::string run_scatter(const ScatterCase& c, const MeshUnderTest& m, const Grid& grid,
                        int& no_comm) {
  const std::vector<double> values = random_global(product(c.x_shape), c.salt, 1, c.single);
  std::vector<Int> ids(static_cast<std::size_t>(product(c.i_shape)));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<Int>(mix(c.salt * 17 + i) % static_cast<std::uint64_t>(c.n));
  using gshard::detail::RuntimeTensor;
  const RuntimeTensor<T> x{
      c.x_layout, c.x_shape,
      device_copy(shard_of<T>(c.x_layout, c.x_shape, values, grid, c.salt, c.single)),
      gshard::ReduceOp::sum};
  const RuntimeTensor<I> ix{c.i_layout, c.i_shape,
                            device_copy(int_shard<I>(c.i_layout, c.i_shape, ids, grid, c.salt)),
                            gshard::ReduceOp::sum};
  const gshard::detail::ScatterLayouts rules =
      gshard::detail::scatter_layouts(c.x_layout, c.i_layout, c.v);
  Int calls = 0;
  Int planned = gshard::detail::plan_reshard(c.i_layout, rules.indices, c.i_shape, m.state->sizes,
                                             m.state->coords, c.names, Int{sizeof(I)})
                    .bytes();
  planned += check_bytes(rules.indices, c.sizes, calls);
  const bool in_place = c.i_layout == rules.indices;
  gshard::comm_counters().reset();
  RuntimeTensor<T> r;
  std::string threw;
  try {
    r = gshard::detail::scatter_add_runtime<T, I>(c.v, c.n, *m.state, c.names, x, ix);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  const gshard::CommCount counted = gshard::comm_counters().total();
  std::string out_labels(1, c.v);
  Shape out_shape{c.n};
  for (std::size_t d = 0; d < c.x_labels.size(); ++d)
    if (c.i_labels.find(c.x_labels[d]) == std::string::npos) {
      out_labels += c.x_labels[d];
      out_shape.push_back(c.x_shape[d]);
    }
  std::string wrong;
  if (!(r.layout == rules.output))
    wrong = "result layout \"" + layout_text(r.layout, c.names) + "\", the rule says \"" +
            layout_text(rules.output, c.names) + "\"";
  // The rule's promise: no data moves besides the indices' reshard; the result is partial over
  // the values' split axes of the index labels and the values' own pending axes.
  std::string got_labels;
  for (int d = 0; d < r.layout.rank; ++d) got_labels += r.layout.dims[d].label;
  if (wrong.empty() && (got_labels != out_labels || r.shape != out_shape))
    wrong = "result labels " + got_labels + " shape " + list_text(r.shape) + ", expected " +
            out_labels + " " + list_text(out_shape);
  if (wrong.empty() && in_place && counted.calls != calls)
    wrong = "indices in place, yet " + std::to_string(counted.calls) + " collectives ran";
  if (wrong.empty() && counted.bytes != planned)
    wrong = "counters show " + std::to_string(counted.bytes) + " bytes, expected " +
            std::to_string(planned);
  if (in_place) ++no_comm;
  const auto o_st = strides_of(out_labels, out_shape);
  const auto i_st = strides_of(c.i_labels, c.i_shape);
  std::vector<double> ref(static_cast<std::size_t>(product(out_shape)), 0.0);
  for_each_global(c.x_labels, c.x_shape, [&](Int g, const std::map<char, Int>& at) {
    Int ii = 0, oi = 0;
    for (char l : c.i_labels) ii += at.at(l) * i_st.at(l);
    for (char l : out_labels)
      oi += (l == c.v ? ids[static_cast<std::size_t>(ii)] : at.at(l)) * o_st.at(l);
    ref[static_cast<std::size_t>(oi)] += values[static_cast<std::size_t>(g)];
  });
  int usable = got_labels == out_labels && r.shape == out_shape ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (usable) {
    const std::string v = check_block<T>(host_copy(r.data), r.layout, r.shape, ref, grid, *m.state);
    if (wrong.empty()) wrong = v;
  }
  return wrong.empty() ? "" : wrong + " (result \"" + layout_text(r.layout, c.names) + "\")";
}

constexpr int take_cases = 240;
constexpr int scatter_cases = 180;

}  // namespace

TEST_CASE("take (run-time engine): random layouts, shapes and meshes vs a naive lookup") {
  const gshard::test::TestMeshes meshes(world_size());
  const int per_mesh =
      (take_cases + static_cast<int>(meshes.all.size()) - 1) / static_cast<int>(meshes.all.size());
  Dice dice(5150);
  int cases = 0, failures = 0, no_comm = 0, v_split = 0, megatron = 0, partial_in = 0;
  for (const auto& m : meshes.all) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const TakeCase c = random_take(dice, m, static_cast<std::uint64_t>(cases) + 1);
      const int vd = find_label(c.t_layout, c.v);
      v_split += c.t_layout.dims[static_cast<std::size_t>(vd)].axis_count > 0 ? 1 : 0;
      const auto rules = gshard::detail::take_layouts(c.t_layout, c.i_layout, c.v);
      megatron += c.t_layout.dims[static_cast<std::size_t>(vd)].axis_count > 0 &&
                          rules.table.dims[static_cast<std::size_t>(vd)].axis_count > 0
                      ? 1
                      : 0;
      partial_in += c.t_layout.partial_count + c.i_layout.partial_count > 0 ? 1 : 0;
      std::string wrong;
      if (c.single)
        wrong = c.wide ? run_take<float, std::int64_t>(c, m, grid, no_comm)
                       : run_take<float, std::int32_t>(c, m, grid, no_comm);
      else
        wrong = c.wide ? run_take<double, std::int64_t>(c, m, grid, no_comm)
                       : run_take<double, std::int32_t>(c, m, grid, no_comm);
      if (!wrong.empty() && failures++ < 8)
        FAIL_CHECK(describe(c, cases)
                   << " at " << world_size() << " ranks, rank " << world_rank() << ": " << wrong);
      ++cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(cases << " random takes over " << meshes.all.size() << " meshes: " << v_split
                  << " with V split, " << megatron << " looked up per vocabulary shard, "
                  << partial_in << " with partial operands, " << no_comm
                  << " with operands in place");
  CHECK(cases >= 100);
  CHECK(failures == 0);
  if (world_size() > 1) CHECK(megatron > 10);
}

TEST_CASE("scatter_add (run-time engine): random layouts, shapes and meshes vs a naive loop") {
  const gshard::test::TestMeshes meshes(world_size());
  const int per_mesh = (scatter_cases + static_cast<int>(meshes.all.size()) - 1) /
                       static_cast<int>(meshes.all.size());
  Dice dice(6160);
  int cases = 0, failures = 0, no_comm = 0, partial_out = 0;
  for (const auto& m : meshes.all) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const ScatterCase c = random_scatter(dice, m, static_cast<std::uint64_t>(cases) + 7);
      partial_out +=
          gshard::detail::scatter_layouts(c.x_layout, c.i_layout, c.v).output.partial_count > 0;
      std::string wrong;
      if (c.single)
        wrong = c.wide ? run_scatter<float, std::int64_t>(c, m, grid, no_comm)
                       : run_scatter<float, std::int32_t>(c, m, grid, no_comm);
      else
        wrong = c.wide ? run_scatter<double, std::int64_t>(c, m, grid, no_comm)
                       : run_scatter<double, std::int32_t>(c, m, grid, no_comm);
      if (!wrong.empty() && failures++ < 8)
        FAIL_CHECK(describe(c, cases)
                   << " at " << world_size() << " ranks, rank " << world_rank() << ": " << wrong);
      ++cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(cases << " random scatter_adds over " << meshes.all.size() << " meshes: " << partial_out
                  << " with partial results, " << no_comm << " with indices in place");
  CHECK(cases >= 100);
  CHECK(failures == 0);
}

// --- typed API, communication counts ------------------------------------------------------------

namespace {

using M = gshard::Mesh<"x", "y">;

template <class S>
S from_values(const M& mesh, const Shape& shape, const std::vector<double>& global) {
  std::vector<typename S::value_type> g(global.begin(), global.end());
  return gshard::from_global<S>(mesh, shape, g);
}

// The naive take of a table "V M" (rows of width w) by ids (any shape), row-major.
std::vector<double> naive_take(const std::vector<double>& table, Int w,
                               const std::vector<double>& ids) {
  std::vector<double> out;
  for (double id : ids)
    for (Int j = 0; j < w; ++j) out.push_back(table[static_cast<std::size_t>(Int(id) * w + j)]);
  return out;
}

std::vector<double> ids_for(Int count, Int n, std::uint64_t salt) {
  std::vector<double> ids(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < ids.size(); ++i)
    ids[i] = static_cast<double>(mix(salt + i) % static_cast<std::uint64_t>(n));
  return ids;
}

}  // namespace

TEST_CASE("embedding lookup with the table split over the vocabulary: no communication, partial") {
  const int n = world_size();
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    INFO("mesh " << ax << "x" << n / ax);
    const Int V = 13, D = 6, B = 3, S = 5;  // uneven vocabulary shards
    using Table = gshard::Sharded<double, M, "V:x D">;
    using Ids = gshard::Sharded<std::int32_t, M, "B S">;
    const std::vector<double> table = random_global(V * D, 11, 0, false);
    const std::vector<double> ids = ids_for(B * S, V, 3);
    const auto t = from_values<Table>(mesh, {V, D}, table);
    const auto i = from_values<Ids>(mesh, {B, S}, ids);
    gshard::comm_counters().reset();
    const auto e = gshard::embedding<"V">(t, i);
    static_assert(std::is_same_v<decltype(e), const gshard::Sharded<double, M, "B S D +x">>);
    CHECK(gshard::comm_counters().total().calls == 0);  // masked local lookup, no collective
    // Finished by the written reshard: exactly one AllReduce over x.
    const auto done = gshard::reshard<gshard::Sharded<double, M, "B S D">>(e);
    const auto c = gshard::comm_counters().get("x", gshard::Collective::all_reduce);
    CHECK(gshard::comm_counters().total().calls == (ax > 1 ? 1 : 0));
    CHECK(c.calls == (ax > 1 ? 1 : 0));
    CHECK(c.bytes == 2 * (ax - 1) * B * S * D * 8 / ax);
    CHECK(done.to_global() == naive_take(table, D, ids));
    CHECK(e.to_global() == naive_take(table, D, ids));
    // A lazy table (an elementwise expression) is evaluated in place, then looked up.
    gshard::comm_counters().reset();
    const auto lazy = gshard::take<"V">(t + t, i);
    static_assert(std::is_same_v<decltype(lazy), const gshard::Sharded<double, M, "B S D +x">>);
    CHECK(gshard::comm_counters().total().calls == 0);
    std::vector<double> twice = naive_take(table, D, ids);
    for (double& v : twice) v *= 2;
    CHECK(lazy.to_global() == twice);

    // D split over y as well: it keeps y; the lookup is still local.
    using Table2 = gshard::Sharded<float, M, "V:x D:y">;
    using Ids2 = gshard::Sharded<std::int64_t, M, "B S">;
    const auto t2 = from_values<Table2>(mesh, {V, D}, table);
    const auto i2 = from_values<Ids2>(mesh, {B, S}, ids);
    gshard::comm_counters().reset();
    const auto e2 = gshard::take<"V">(t2, i2);
    static_assert(std::is_same_v<decltype(e2), const gshard::Sharded<float, M, "B S D:y +x">>);
    CHECK(gshard::comm_counters().total().calls == 0);
    const std::vector<float> got = e2.to_global();
    const std::vector<double> want = naive_take(table, D, ids);
    CHECK(std::vector<double>(got.begin(), got.end()) == want);
  }
}

TEST_CASE("take and scatter_add, typed: result specs from the rules, values via to_global") {
  const int n = world_size();
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    INFO("mesh " << ax << "x" << n / ax);
    const Int V = 7, D = 5, B = 6, S = 3;
    const std::vector<double> table = random_global(V * D, 21, 0, false);
    const std::vector<double> ids = ids_for(B * S, V, 9);
    // The indices use V's axis: the table is gathered over V, no partial result.
    {
      const auto t = from_values<gshard::Sharded<double, M, "V:x D">>(mesh, {V, D}, table);
      const auto i = from_values<gshard::Sharded<std::int64_t, M, "B:x S">>(mesh, {B, S}, ids);
      const auto r = gshard::take<"V">(t, i);
      static_assert(std::is_same_v<decltype(r), const gshard::Sharded<double, M, "B:x S D">>);
      CHECK(r.to_global() == naive_take(table, D, ids));
    }
    // D's y is taken by the indices: D replicated; V's x is free: partial over x.
    {
      const auto t = from_values<gshard::Sharded<double, M, "D:y V:x">>(mesh, {D, V}, [&] {
        std::vector<double> tr(static_cast<std::size_t>(V * D));
        for (Int v = 0; v < V; ++v)
          for (Int d = 0; d < D; ++d)
            tr[static_cast<std::size_t>(d * V + v)] = table[static_cast<std::size_t>(v * D + d)];
        return tr;
      }());
      const auto i = from_values<gshard::Sharded<std::int32_t, M, "B:y S">>(mesh, {B, S}, ids);
      const auto r = gshard::take<"V">(t, i);
      static_assert(std::is_same_v<decltype(r), const gshard::Sharded<double, M, "B:y S D +x">>);
      CHECK(r.to_global() == naive_take(table, D, ids));
    }
    // A table with a pending partial sum over y stays pending (take is linear in the table).
    {
      const auto t = from_values<gshard::Sharded<double, M, "V D +y">>(mesh, {V, D}, table);
      const auto i = from_values<gshard::Sharded<std::int32_t, M, "B S:x">>(mesh, {B, S}, ids);
      gshard::comm_counters().reset();
      const auto r = gshard::take<"V">(t, i);
      static_assert(std::is_same_v<decltype(r), const gshard::Sharded<double, M, "B S:x D +y">>);
      CHECK(gshard::comm_counters().total().calls == (ax > 1 ? 1 : 0));  // the bounds check only
      CHECK(r.to_global() == naive_take(table, D, ids));
    }
    // scatter_add: values "B:x S D:y", indices "B:x S" -> "V D:y +x", no data moves; the result
    // is the transpose of take: <take(t, i), g> == <t, scatter_add(g, i)>.
    {
      const std::vector<double> g = random_global(B * S * D, 23, 1, false);
      const auto x = from_values<gshard::Sharded<double, M, "B:x S D:y">>(mesh, {B, S, D}, g);
      const auto i = from_values<gshard::Sharded<std::int32_t, M, "B:x S">>(mesh, {B, S}, ids);
      gshard::comm_counters().reset();
      const auto r = gshard::scatter_add<"V">(x, i, V);
      static_assert(std::is_same_v<decltype(r), const gshard::Sharded<double, M, "V D:y +x">>);
      // Only the bounds check (3 int64 over x) communicates.
      CHECK(gshard::comm_counters().total().calls == (ax > 1 ? 1 : 0));
      CHECK(gshard::comm_counters().total().bytes == 2 * (ax - 1) * 24 / ax);
      std::vector<double> want(static_cast<std::size_t>(V * D), 0.0);
      for (Int b = 0; b < B * S; ++b)
        for (Int d = 0; d < D; ++d)
          want[static_cast<std::size_t>(Int(ids[static_cast<std::size_t>(b)]) * D + d)] +=
              g[static_cast<std::size_t>(b * D + d)];
      CHECK(r.to_global() == want);
      const std::vector<double> tk = naive_take(table, D, ids);
      double lhs = 0, rhs = 0;
      for (std::size_t k = 0; k < tk.size(); ++k) lhs += tk[k] * g[k];
      const std::vector<double> sc = r.to_global();
      for (std::size_t k = 0; k < sc.size(); ++k) rhs += table[k] * sc[k];
      CHECK(std::abs(lhs - rhs) <= 1e-12 * (1 + std::abs(lhs)));
    }
    // Indices split differently from the values: the indices move (AllToAll-like), not the values.
    {
      const std::vector<double> g = random_global(B * S * D, 29, 1, false);
      const auto x = from_values<gshard::Sharded<double, M, "S B:y D">>(mesh, {S, B, D}, [&] {
        std::vector<double> tr(g.size());
        for (Int b = 0; b < B; ++b)
          for (Int s = 0; s < S; ++s)
            for (Int d = 0; d < D; ++d)
              tr[static_cast<std::size_t>((s * B + b) * D + d)] =
                  g[static_cast<std::size_t>((b * S + s) * D + d)];
        return tr;
      }());
      const auto i = from_values<gshard::Sharded<std::int64_t, M, "B:x S">>(mesh, {B, S}, ids);
      const auto r = gshard::scatter_add<"V">(x, i, V);
      static_assert(std::is_same_v<decltype(r), const gshard::Sharded<double, M, "V D +y">>);
      std::vector<double> want(static_cast<std::size_t>(V * D), 0.0);
      for (Int b = 0; b < B * S; ++b)
        for (Int d = 0; d < D; ++d)
          want[static_cast<std::size_t>(Int(ids[static_cast<std::size_t>(b)]) * D + d)] +=
              g[static_cast<std::size_t>(b * D + d)];
      CHECK(r.to_global() == want);
    }
  }
}

// --- errors -------------------------------------------------------------------------------------

namespace {

// The same message on every rank: compared through its length and a hash.
bool same_everywhere(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (char ch : s) h = (h ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
  long long mine[2] = {static_cast<long long>(h >> 1), static_cast<long long>(s.size())};
  long long lo[2] = {0, 0}, hi[2] = {0, 0};
  MPI_Allreduce(mine, lo, 2, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(mine, hi, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo[0] == hi[0] && lo[1] == hi[1];
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const gshard::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("out-of-range indices and disagreeing sizes throw gshard::Error on every rank") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  const Int V = 5, D = 3, B = 8;
  const auto t = gshard::full<gshard::Sharded<double, M, "V:x D">>(mesh, {V, D}, 1.0);
  // One bad index, on the last rank's shard only: every rank must throw the same message.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B), 1);
  ids[B - 1] = 9;
  ids[0] = -2;
  {
    const auto i = gshard::from_global<gshard::Sharded<std::int32_t, M, "B:x">>(mesh, {B}, ids);
    const std::string msg = message_of([&] { (void)gshard::take<"V">(t, i); });
    CHECK(msg.find("take<\"V\">") != std::string::npos);
    CHECK(msg.find("[0, 5)") != std::string::npos);
    CHECK(msg.find("from -2 to 9") != std::string::npos);
    CHECK(msg.find("\"V:x D\" of shape [5, 3]") != std::string::npos);
    CHECK(same_everywhere(msg));
    const auto x = gshard::full<gshard::Sharded<double, M, "B:x D">>(mesh, {B, D}, 1.0);
    const std::string msg2 = message_of([&] { (void)gshard::scatter_add<"V">(x, i, V); });
    CHECK(msg2.find("scatter_add<\"V\">") != std::string::npos);
    CHECK(msg2.find("from -2 to 9") != std::string::npos);
    CHECK(same_everywhere(msg2));
  }
  // Replicated indices: every rank sees them all, so the check needs no collective.
  {
    const auto i = gshard::from_global<gshard::Sharded<std::int32_t, M, "B">>(mesh, {B}, ids);
    gshard::comm_counters().reset();
    const std::string msg = message_of([&] { (void)gshard::take<"V">(t, i); });
    CHECK(msg.find("from -2 to 9") != std::string::npos);
    CHECK(gshard::comm_counters().total().calls == 0);
    CHECK(same_everywhere(msg));
  }
  // Sizes that disagree between the values and the indices.
  {
    const auto x = gshard::full<gshard::Sharded<double, M, "B:x D">>(mesh, {B + 1, D}, 1.0);
    const auto i = gshard::full<gshard::Sharded<std::int64_t, M, "B">>(mesh, {B}, 0);
    const std::string msg = message_of([&] { (void)gshard::scatter_add<"V">(x, i, V); });
    CHECK(msg.find("label 'B' has size 9 in the values but 8 in the indices") != std::string::npos);
    CHECK(same_everywhere(msg));
    const auto x2 = gshard::full<gshard::Sharded<double, M, "B:x D">>(mesh, {B, D}, 1.0);
    CHECK(message_of([&] { (void)gshard::scatter_add<"V">(x2, i, -1); }).find("negative") !=
          std::string::npos);
  }
  // The run-time engine rejects what the typed API rejects at compile time.
  {
    const auto rt = gshard::detail::runtime_tensor(t);
    const auto ri = gshard::detail::runtime_tensor(
        gshard::full<gshard::Sharded<std::int32_t, M, "B D">>(mesh, {2, 3}, 0));
    const auto names = gshard::detail::axis_name_list<M>();
    CHECK(message_of([&] {
            (void)gshard::detail::take_runtime<double>('Q', gshard::detail::mesh_state(mesh), names,
                                                       rt, ri);
          }).find("no label 'Q'") != std::string::npos);
    CHECK(message_of([&] {
            (void)gshard::detail::take_runtime<double>('V', gshard::detail::mesh_state(mesh), names,
                                                       rt, ri);
          }).find("'D' is in both") != std::string::npos);
  }
}
