// Resharding, property-based: hundreds of random (source layout, target layout, shape, mesh)
// cases through the run-time planner and executor, each checked exactly against our own block
// arithmetic over a global integer tensor; then a smaller set of typed cases through the public
// reshard<Target>() / implicit conversion / reshard_into() / to_global().
//
// Every rank draws the same cases from the same seed (SPMD). The source shard is built by us: the
// global tensor's block, zero padded; for a partial source, the global value split into random
// summands over the partial coordinates. The target shard must equal our expected block, padding
// included; for a partial target, the sum of the copies over the partial axes must.
#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "block_reference.hpp"
#include "mpi_test.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

// --- our own geometry ---------------------------------------------------------------------------

using gshard::test::block1;
using gshard::test::Block1;
using gshard::test::Grid;
using gshard::test::grid_of;

int find_label(const Layout& l, char label) {
  for (int d = 0; d < l.rank; ++d)
    if (l.dims[d].label == label) return d;
  return -1;
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser, our own copy
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// The share of partial copy q (of Q) of a global value: random summands for q > 0, the rest at 0.
Int summand(Int value, Int g, int q, int copies, std::uint64_t salt) {
  if (copies == 1) return value;
  auto part = [&](int j) {
    return static_cast<Int>(
               mix(salt ^ mix(static_cast<std::uint64_t>(g) * 64 + static_cast<std::uint64_t>(j))) %
               201) -
           100;
  };
  if (q != 0) return part(q);
  Int rest = value;
  for (int j = 1; j < copies; ++j) rest -= part(j);
  return rest;
}

struct LocalBlock {
  std::vector<Int> value;
  std::vector<char> pad;  // 1 where the element is padding
};

// This rank's padded block under `l` of the global tensor `global`, which is stored row-major in
// the label order of `src` with shape `src_shape`. With `split_partials`, a layout with partial
// axes gets this rank's random summand instead of the value.
LocalBlock local_block(const Layout& l, const Layout& src, const Shape& src_shape,
                       const std::vector<Int>& global, const Grid& grid, bool split_partials,
                       std::uint64_t salt) {
  const int r = l.rank;
  std::vector<Int> src_stride(static_cast<std::size_t>(r));
  Int s = 1;
  for (int d = r - 1; d >= 0; --d) {
    src_stride[static_cast<std::size_t>(d)] = s;
    s *= src_shape[static_cast<std::size_t>(d)];
  }
  std::vector<Block1> b(static_cast<std::size_t>(r));
  std::vector<Int> stride(static_cast<std::size_t>(r));  // global stride of each dim of l
  Int total = 1;
  for (int d = 0; d < r; ++d) {
    const int sd = find_label(src, l.dims[d].label);
    const auto du = static_cast<std::size_t>(d);
    b[du] = block1(src_shape[static_cast<std::size_t>(sd)], l.dims[d].axes.data(),
                   l.dims[d].axis_count, grid);
    stride[du] = src_stride[static_cast<std::size_t>(sd)];
    total *= b[du].chunk;
  }
  int copies = 1;
  int q = 0;  // this rank's index among the partial copies (row-major over the partial axes)
  for (int i = 0; i < l.partial_count; ++i) {
    const auto a = static_cast<std::size_t>(l.partial[i]);
    copies *= grid.sizes[a];
    q = q * grid.sizes[a] + grid.coords[a];
  }
  if (!split_partials) copies = 1;
  LocalBlock out{std::vector<Int>(static_cast<std::size_t>(total), 0),
                 std::vector<char>(static_cast<std::size_t>(total), 0)};
  for (Int i = 0; i < total; ++i) {
    Int rest = i;
    Int g = 0;
    bool pad = false;
    for (int d = r - 1; d >= 0; --d) {
      const auto du = static_cast<std::size_t>(d);
      const Int local = rest % b[du].chunk;
      rest /= b[du].chunk;
      if (local >= b[du].valid) pad = true;
      g += (b[du].offset + local) * stride[du];
    }
    const auto iu = static_cast<std::size_t>(i);
    if (pad) {
      out.pad[iu] = 1;
    } else {
      out.value[iu] = summand(global[static_cast<std::size_t>(g)], g, q, copies, salt);
    }
  }
  return out;
}

unsigned partial_mask_of(const Layout& l) {
  unsigned m = 0;
  for (int i = 0; i < l.partial_count; ++i) m |= 1u << l.partial[i];
  return m;
}

// The global tensor (row-major in `src` order) rewritten row-major in `to` order.
std::vector<Int> transposed(const std::vector<Int>& global, const Layout& src,
                            const Shape& src_shape, const Layout& to) {
  const int r = src.rank;
  std::vector<Int> src_stride(static_cast<std::size_t>(r));
  Int s = 1;
  for (int d = r - 1; d >= 0; --d) {
    src_stride[static_cast<std::size_t>(d)] = s;
    s *= src_shape[static_cast<std::size_t>(d)];
  }
  Shape to_shape(static_cast<std::size_t>(r));
  std::vector<Int> stride(static_cast<std::size_t>(r));
  for (int d = 0; d < r; ++d) {
    const auto sd = static_cast<std::size_t>(find_label(src, to.dims[d].label));
    to_shape[static_cast<std::size_t>(d)] = src_shape[sd];
    stride[static_cast<std::size_t>(d)] = src_stride[sd];
  }
  std::vector<Int> out(global.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    Int rest = static_cast<Int>(i);
    Int g = 0;
    for (int d = r - 1; d >= 0; --d) {
      const auto du = static_cast<std::size_t>(d);
      g += (rest % to_shape[du]) * stride[du];
      rest /= to_shape[du];
    }
    out[i] = global[static_cast<std::size_t>(g)];
  }
  return out;
}

// --- describing a case (our own printer, so a failure reads the same whatever the library does)

std::string layout_text(const Layout& l, const std::vector<std::string>& names) {
  std::string s;
  for (int d = 0; d < l.rank; ++d) {
    if (d > 0) s += ' ';
    s += l.dims[d].label;
    for (int i = 0; i < l.dims[d].axis_count; ++i) {
      s += i == 0 ? ':' : '*';
      s += names[static_cast<std::size_t>(l.dims[d].axes[i])];
    }
  }
  for (int i = 0; i < l.partial_count; ++i) {
    s += " +";
    s += names[static_cast<std::size_t>(l.partial[i])];
  }
  return s;
}

std::string list_text(const std::vector<Int>& v, char sep) {
  std::string s;
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += sep;
    s += std::to_string(v[i]);
  }
  return s;
}

std::string sizes_text(const std::vector<int>& sizes) {
  return list_text(std::vector<Int>(sizes.begin(), sizes.end()), 'x');
}

// --- random layouts
// --------------------------------------------------------------------------------

// A layout by label: the axes splitting each label's dimension (major first) and the partial axes.
struct Draft {
  std::vector<char> labels;  // in the order of `axes`
  std::vector<std::vector<int>> axes;
  std::vector<int> partial;
};

Layout build(const Draft& d, const std::vector<char>& order) {
  Layout l;
  l.rank = static_cast<int>(order.size());
  for (int i = 0; i < l.rank; ++i) {
    const auto at = static_cast<std::size_t>(
        std::find(d.labels.begin(), d.labels.end(), order[static_cast<std::size_t>(i)]) -
        d.labels.begin());
    l.dims[i].label = order[static_cast<std::size_t>(i)];
    for (int a : d.axes[at]) l.dims[i].axes[l.dims[i].axis_count++] = a;
  }
  for (int a : d.partial) l.partial[l.partial_count++] = a;
  return l;
}

std::vector<int> unused_axes(const Draft& d, int axis_count) {
  std::vector<int> out;
  for (int a = 0; a < axis_count; ++a) {
    bool used = std::find(d.partial.begin(), d.partial.end(), a) != d.partial.end();
    for (const auto& list : d.axes)
      used = used || std::find(list.begin(), list.end(), a) != list.end();
    if (!used) out.push_back(a);
  }
  return out;
}

using gshard::test::Dice;

Draft random_draft(Dice& dice, const std::vector<char>& labels, int axis_count) {
  Draft d{labels, std::vector<std::vector<int>>(labels.size()), {}};
  std::vector<int> axes(static_cast<std::size_t>(axis_count));
  for (int a = 0; a < axis_count; ++a) axes[static_cast<std::size_t>(a)] = a;
  dice.shuffle(axes);  // the order axes join a dimension: major/minor at random
  const int r = static_cast<int>(labels.size());
  for (int a : axes) {
    const int where = dice.below(r + 1);  // r: not splitting anything
    if (where < r) d.axes[static_cast<std::size_t>(where)].push_back(a);
  }
  auto unused = unused_axes(d, axis_count);
  dice.shuffle(unused);
  for (int a : unused)
    if (dice.chance(35)) d.partial.push_back(a);
  return d;
}

// One small change of the kind GShard's table handles with a single collective (or none).
bool mutate(Dice& dice, Draft& d, const std::vector<int>& sizes) {
  const int axis_count = static_cast<int>(sizes.size());
  const int r = static_cast<int>(d.labels.size());
  std::vector<int> split_dims;
  for (int i = 0; i < r; ++i)
    if (!d.axes[static_cast<std::size_t>(i)].empty()) split_dims.push_back(i);
  const auto unused = unused_axes(d, axis_count);
  auto dim = [&](int i) -> std::vector<int>& { return d.axes[static_cast<std::size_t>(i)]; };
  switch (dice.below(7)) {
    case 0:  // an axis stops splitting (AllGather)
      if (split_dims.empty()) return false;
      dim(dice.pick(split_dims)).pop_back();
      return true;
    case 1:  // an unused axis starts splitting (local slice)
      if (unused.empty()) return false;
      dim(dice.below(r)).push_back(dice.pick(unused));
      return true;
    case 2: {  // the minor axis of one dimension moves to another (AllToAll)
      if (split_dims.empty() || r < 2) return false;
      const int x = dice.pick(split_dims);
      int y = dice.below(r - 1);
      if (y >= x) ++y;
      dim(y).push_back(dim(x).back());
      dim(x).pop_back();
      return true;
    }
    case 3: {  // one splitting axis replaced by an unused one (CollectivePermute if sizes match)
      if (split_dims.empty() || unused.empty()) return false;
      auto& list = dim(dice.pick(split_dims));
      auto& slot = list[static_cast<std::size_t>(dice.below(static_cast<int>(list.size())))];
      // Mostly an axis of the same size, when there is one: that is the permute of the table.
      std::vector<int> same;
      for (int b : unused)
        if (sizes[static_cast<std::size_t>(b)] == sizes[static_cast<std::size_t>(slot)])
          same.push_back(b);
      slot = !same.empty() && dice.chance(75) ? dice.pick(same) : dice.pick(unused);
      return true;
    }
    case 4: {  // a partial axis becomes a split (ReduceScatter)
      if (d.partial.empty()) return false;
      const auto at = static_cast<std::size_t>(dice.below(static_cast<int>(d.partial.size())));
      dim(dice.below(r)).push_back(d.partial[at]);
      d.partial.erase(d.partial.begin() + static_cast<std::ptrdiff_t>(at));
      return true;
    }
    case 5: {  // a partial axis is reduced (AllReduce)
      if (d.partial.empty()) return false;
      const auto at = static_cast<std::size_t>(dice.below(static_cast<int>(d.partial.size())));
      d.partial.erase(d.partial.begin() + static_cast<std::ptrdiff_t>(at));
      return true;
    }
    default:  // an unused axis becomes partial (local)
      if (unused.empty()) return false;
      d.partial.push_back(dice.pick(unused));
      return true;
  }
}

struct Case {
  std::vector<int> sizes;
  std::vector<std::string> names;
  Layout from;
  Layout to;
  Shape shape;  // in `from` order
  std::uint64_t salt = 0;
};

Case random_case(Dice& dice, const std::vector<int>& sizes, const std::vector<std::string>& names,
                 std::uint64_t salt) {
  const int axis_count = static_cast<int>(sizes.size());
  std::vector<char> labels = {'A', 'B', 'C', 'D', 'E', 'F', 'G', 'H'};
  dice.shuffle(labels);
  labels.resize(static_cast<std::size_t>(dice.between(1, 4)));
  Case c{sizes, names, {}, {}, {}, salt};
  const Draft source = random_draft(dice, labels, axis_count);
  Draft target;
  if (dice.chance(50)) {
    target = random_draft(dice, labels, axis_count);
  } else {
    target = source;
    const int changes = dice.between(1, 2);
    for (int done = 0, tries = 0; done < changes && tries < 20; ++tries)
      if (mutate(dice, target, sizes)) ++done;
  }
  std::vector<char> target_order = labels;
  if (dice.chance(50)) dice.shuffle(target_order);
  c.from = build(source, labels);
  c.to = build(target, target_order);
  for (std::size_t i = 0; i < labels.size(); ++i) c.shape.push_back(dice.between(1, 9));
  return c;
}

std::string describe(const Case& c, int index) {
  std::ostringstream s;
  s << "case #" << index << ": mesh " << sizes_text(c.sizes) << " (axes";
  for (const auto& n : c.names) s << ' ' << n;
  s << "), \"" << layout_text(c.from, c.names) << "\" -> \"" << layout_text(c.to, c.names)
    << "\", global shape [" << list_text(c.shape, ',') << "] in source order, salt " << c.salt;
  return s.str();
}

std::vector<Int> random_global(const Shape& shape, std::uint64_t salt) {
  Int n = 1;
  for (auto e : shape) n *= e;
  std::vector<Int> g(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<Int>(mix(salt * 1000003ULL + i) % 2001) - 1000;
  return g;
}

template <class V>
std::vector<Int> host_copy(const V& view) {
  auto mirror = Kokkos::create_mirror_view(view);
  Kokkos::deep_copy(mirror, view);
  return std::vector<Int>(mirror.data(), mirror.data() + mirror.extent(0));
}

Kokkos::View<Int*> device_copy(const std::vector<Int>& v) {
  Kokkos::View<Int*> view("source shard", v.size());
  auto mirror = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < v.size(); ++i) mirror(i) = v[i];
  Kokkos::deep_copy(view, mirror);
  return view;
}

// Checks a target shard against the expected block; on a partial target, every copy must have
// zero padding and the sum of the copies over the partial axes must equal the block. Returns ""
// when right, else what is wrong.
std::string check_target(std::vector<Int> got, const LocalBlock& expect, const Layout& to,
                         const gshard::detail::MeshState& mesh) {
  if (got.size() != expect.value.size())
    return "local size " + std::to_string(got.size()) + ", expected " +
           std::to_string(expect.value.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (expect.pad[i] && got[i] != 0)
      return "padding element " + std::to_string(i) + " holds " + std::to_string(got[i]);
  const unsigned mask = partial_mask_of(to);
  if (mask != 0)
    MPI_Allreduce(MPI_IN_PLACE, got.data(), static_cast<int>(got.size()), MPI_INT64_T, MPI_SUM,
                  mesh.groups[mask]);
  for (std::size_t i = 0; i < got.size(); ++i)
    if (got[i] != expect.value[i])
      return "local element " + std::to_string(i) + (mask ? " (summed over partial copies)" : "") +
             " is " + std::to_string(got[i]) + ", expected " + std::to_string(expect.value[i]) +
             "; local [" + list_text(got, ',') + "] expected [" + list_text(expect.value, ',') +
             "]";
  return "";
}

// Runs one case through the run-time planner and executor; "" when right.
std::string run_case(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid,
                     std::map<std::string, int>& kinds) {
  const std::vector<Int> global = random_global(c.shape, c.salt);
  const LocalBlock src = local_block(c.from, c.from, c.shape, global, grid, true, c.salt);
  const LocalBlock expect = local_block(c.to, c.from, c.shape, global, grid, false, c.salt);
  std::array<int, gshard::max_axes> sizes{};
  std::array<int, gshard::max_axes> coords{};
  for (std::size_t a = 0; a < c.sizes.size(); ++a) {
    sizes[a] = c.sizes[a];
    coords[a] = grid.coords[a];
  }
  const gshard::ReshardPlan plan = gshard::detail::plan_reshard(
      c.from, c.to, c.shape, sizes, coords, c.names, static_cast<Int>(sizeof(Int)));
  for (const auto& step : plan.steps) kinds[gshard::step_name(step.kind)] += 1;
  gshard::comm_counters().reset();
  Kokkos::View<Int*> out;
  try {
    const gshard::detail::ReshardExecutor<Int> executor(plan, mesh, gshard::ReduceOp::sum);
    if (c.salt % 2 == 0) {
      // Every other case writes the last step into a caller's buffer (as reshard_into does),
      // filled with garbage first: every element, padding included, must be overwritten.
      Kokkos::View<Int*> dst("target shard", expect.value.size());
      Kokkos::deep_copy(dst, Int{0x5A5A5A5A});
      out = executor.run(device_copy(src.value), dst);
    } else {
      out = executor.run(device_copy(src.value));
    }
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
  const gshard::CommCount counted = gshard::comm_counters().total();
  std::string wrong = check_target(host_copy(out), expect, c.to, mesh);
  // The plan's byte counts are what the counters show; one call per communicating step.
  Int calls = 0;
  for (const auto& step : plan.steps) calls += step.axes != 0 ? 1 : 0;
  if (wrong.empty() && counted.bytes != plan.bytes())
    wrong = "counters show " + std::to_string(counted.bytes) + " bytes, the plan says " +
            std::to_string(plan.bytes());
  if (wrong.empty() && counted.calls != calls)
    wrong = "counters show " + std::to_string(counted.calls) + " calls, the plan has " +
            std::to_string(calls) + " communicating steps";
  if (!wrong.empty()) wrong += "\nplan on this rank:\n" + gshard::explain(plan);
  return wrong;
}

struct MeshUnderTest {
  std::vector<int> sizes;
  std::vector<std::string> names;
  const gshard::detail::MeshState* state;
};

// Two-axis meshes of every shape for this rank count, 2x2x2 at 8, and a few three- and four-axis
// meshes with axes of size 1.
std::vector<std::vector<int>> mesh_shapes(int n) {
  std::vector<std::vector<int>> out = gshard::test::listed_mesh_shapes(n);
  switch (n) {
    case 1:
      out.push_back({1, 1, 1});
      break;
    case 2:
      out.push_back({1, 2, 1});
      break;
    case 4:
      out.insert(out.end(), {{2, 1, 2}, {1, 2, 1, 2}});
      break;
    case 8:
      out.push_back({2, 1, 2, 2});
      break;
    default:
      break;
  }
  return out;
}

constexpr int total_random_cases = 1000;

}  // namespace

TEST_CASE("reshard (run-time engine): random layouts, shapes and meshes, checked exactly") {
  using M2 = gshard::Mesh<"x", "y">;
  using M3 = gshard::Mesh<"x", "y", "z">;
  using M4 = gshard::Mesh<"x", "y", "z", "w">;
  const int n = world_size();
  std::vector<M2> meshes2;
  std::vector<M3> meshes3;
  std::vector<M4> meshes4;
  std::vector<MeshUnderTest> meshes;
  const auto shapes = mesh_shapes(n);
  meshes2.reserve(shapes.size());
  meshes3.reserve(shapes.size());
  meshes4.reserve(shapes.size());
  for (const auto& s : shapes) {
    if (s.size() == 2) {
      meshes2.emplace_back(MPI_COMM_WORLD, std::initializer_list<int>{s[0], s[1]});
      meshes.push_back({s, {"x", "y"}, &gshard::detail::mesh_state(meshes2.back())});
    } else if (s.size() == 3) {
      meshes3.emplace_back(MPI_COMM_WORLD, std::initializer_list<int>{s[0], s[1], s[2]});
      meshes.push_back({s, {"x", "y", "z"}, &gshard::detail::mesh_state(meshes3.back())});
    } else {
      meshes4.emplace_back(MPI_COMM_WORLD, std::initializer_list<int>{s[0], s[1], s[2], s[3]});
      meshes.push_back({s, {"x", "y", "z", "w"}, &gshard::detail::mesh_state(meshes4.back())});
    }
  }
  const int per_mesh =
      (total_random_cases + static_cast<int>(meshes.size()) - 1) / static_cast<int>(meshes.size());
  Dice dice(20240601);  // the same on every rank: every rank draws the same cases
  int cases = 0;
  int failures = 0;
  int reported = 0;
  std::map<std::string, int> kinds;  // plan steps seen (rank 0's plans), for the log
  for (const auto& m : meshes) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, m.sizes, m.names, static_cast<std::uint64_t>(cases) + 1);
      const std::string wrong = run_case(c, *m.state, grid, kinds);
      if (!wrong.empty()) {
        ++failures;
        if (reported++ < 8) {
          FAIL_CHECK(describe(c, cases)
                     << " at " << world_size() << " ranks, rank " << world_rank() << ": " << wrong);
        }
      }
      ++cases;
    }
  }
  if (world_rank() == 0) {
    std::string seen;
    for (const auto& [name, count] : kinds) seen += " " + name + "=" + std::to_string(count);
    MESSAGE(cases << " random cases over " << meshes.size() << " meshes; steps:" << seen);
  }
  CHECK(cases >= 500);
  CHECK(failures == 0);
}

namespace {

// What a typed reshard produced, for checks compiled once.
struct TypedResult {
  Int planned = 0;
  Int counted = 0;
  std::vector<Int> local;
  std::vector<Int> target_global;
  std::vector<Int> source_global;
  Shape target_shape;
  bool same_storage = true;  // reshard_into kept the target's storage
};

void check_typed(const Case& c, const std::string& what, const TypedResult& r,
                 const std::vector<Int>& global, const LocalBlock& expect,
                 const gshard::detail::MeshState& mesh) {
  INFO(what);
  CHECK(r.counted == r.planned);
  CHECK(r.same_storage);
  CHECK(check_target(r.local, expect, c.to, mesh) == "");
  // The whole tensor, in the target's label order.
  CHECK(r.target_global == transposed(global, c.from, c.shape, c.to));
  CHECK(r.source_global == global);  // the source is untouched
  Shape target_shape;
  for (int d = 0; d < c.to.rank; ++d)
    target_shape.push_back(
        c.shape[static_cast<std::size_t>(find_label(c.from, c.to.dims[d].label))]);
  CHECK(r.target_shape == target_shape);
}

// Typed cases: Source and Target specs over Mesh<"x", "y">; checked with the same arithmetic.
template <class Source, class Target>
void typed_case(const gshard::Mesh<"x", "y">& mesh, const std::vector<int>& sizes, Dice& dice,
                int& cases, int mode) {
  const Grid grid = grid_of(sizes, world_rank());
  Case c{sizes, {"x", "y"}, Source::layout, Target::layout, {}, 0};
  for (int d = 0; d < c.from.rank; ++d) c.shape.push_back(dice.between(1, 9));
  c.salt = 7000 + static_cast<std::uint64_t>(cases);
  const char* how[] = {" (reshard<Target>)", " (implicit conversion)", " (reshard_into)"};
  const std::string what = describe(c, cases) + how[mode];
  ++cases;
  const std::vector<Int> global = random_global(c.shape, c.salt);
  const LocalBlock src = local_block(c.from, c.from, c.shape, global, grid, true, c.salt);
  const LocalBlock expect = local_block(c.to, c.from, c.shape, global, grid, false, c.salt);
  const Source x(mesh, c.shape, device_copy(src.value));  // wraps our shard
  TypedResult r;
  r.planned = gshard::plan_reshard<Target>(x).bytes();
  auto observe = [&](const Target& y) {
    r.counted = gshard::comm_counters().total().bytes;
    r.local = host_copy(y.local_view());
    r.target_global = y.to_global();
    r.target_shape = y.shape();
  };
  if (mode == 1) {
    gshard::comm_counters().reset();
    const Target y = Source(x);  // a fresh value given a declared layout: the annotation path
    observe(y);
  } else if (mode == 0) {
    gshard::comm_counters().reset();
    observe(gshard::reshard<Target>(x));
  } else {
    // Into an existing tensor holding garbage: its storage is reused and fully rewritten.
    Shape target_shape;
    for (int d = 0; d < c.to.rank; ++d)
      target_shape.push_back(
          c.shape[static_cast<std::size_t>(find_label(c.from, c.to.dims[d].label))]);
    Target y = gshard::full<Target>(mesh, target_shape, Int{0x5A5A5A5A});
    const Int* storage = y.local_view().data();
    gshard::comm_counters().reset();
    gshard::reshard_into(x, y);
    observe(y);
    r.same_storage = y.local_view().data() == storage;
  }
  r.source_global = x.to_global();
  check_typed(c, what, r, global, expect, gshard::detail::mesh_state(mesh));
}

}  // namespace

TEST_CASE(
    "reshard<Target>(), implicit conversion, reshard_into: typed cases on every 2-axis mesh") {
  using M = gshard::Mesh<"x", "y">;
  using gshard::Sharded;
  const int n = world_size();
  Dice dice(77);
  int cases = 0;
  int k = 0;  // cycles through the three ways to reshard, across meshes
  for (int a = 1; a <= n; ++a) {
    if (n % a != 0) continue;
    const std::vector<int> sizes{a, n / a};
    const M mesh(MPI_COMM_WORLD, {a, n / a});
    auto run = [&]<gshard::fixed_string From, gshard::fixed_string To>() {
      typed_case<Sharded<Int, M, From>, Sharded<Int, M, To>>(mesh, sizes, dice, cases, k++ % 3);
    };
    run.template operator()<"A:x B C", "A B:x C">();
    run.template operator()<"A:x*y B", "B A:y*x">();
    run.template operator()<"A B +x", "A:x B">();
    run.template operator()<"A B +x +y", "A:y B:x">();
    run.template operator()<"A:y B:x", "A:x B:y">();
    run.template operator()<"A:y B", "A:x B">();
    run.template operator()<"A B C", "C:x B A +y">();
    run.template operator()<"A:x B:y C", "C B A">();
    run.template operator()<"A B:x*y", "A:x*y B">();
    run.template operator()<"A:x B +y", "B A +y">();
    run.template operator()<"A B +y", "A B +x">();
    run.template operator()<"A:y B C:x", "A B:x C:y">();
    run.template operator()<"A B", "A:x B:y">();
    run.template operator()<"A:x*y", "A:y*x">();
    run.template operator()<"A:x", "A +y">();
    run.template operator()<"A:x B C D:y", "D:x C B A:y">();
    run.template operator()<"A B:y +x", "B:x A:y">();
    run.template operator()<"A:y*x B", "A B:x*y">();
    run.template operator()<"A B C", "A B C +x +y">();
    run.template operator()<"A:x B:y", "A B">();
  }
  if (world_rank() == 0) MESSAGE(cases << " typed cases");
  CHECK(cases >= 20);
}

TEST_CASE("reshard<Target>() to the same layout shares the shard") {
  using M = gshard::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  using S = gshard::Sharded<Int, M, "A:y B +x">;
  const S x = gshard::full<S>(mesh, {5, 3}, 4);
  gshard::comm_counters().reset();
  const S y = gshard::reshard<S>(x);
  CHECK(gshard::comm_counters().total().calls == 0);
  CHECK(y.local_view().data() == x.local_view().data());
  CHECK(y.to_global() == std::vector<Int>(15, 4));
}
