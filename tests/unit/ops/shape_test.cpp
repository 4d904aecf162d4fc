// Shape ops (ops/shape.hpp): merge, split, concat, slice, pad.
//
// Property test: random cases through the run-time engines (detail::*_runtime), random layouts
// (the op's label split over one or several axes, replicated, partial over unused axes), uneven
// sizes (often smaller than the shard counts, sometimes zero), every listed mesh shape at the
// running rank count. Shards are built with the tests' own block arithmetic; each result's
// layout is checked against the rules as this file re-derives them, its padding must be zero on
// every copy, and its values (summed over partial copies) must equal a naive loop over the
// global inputs. Then exact communication counts for split labels (the bytes computed here from
// our own blocks), typed cases with hand-written result specs, and errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"
// (mpi_test.hpp first: the op header after it)
#include <gshard/ops/shape.hpp>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::test::axes_of;
using gshard::test::block1;
using gshard::test::Block1;
using gshard::test::device_copy;
using gshard::test::Dice;
using gshard::test::dyadic;
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
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

// --- global tensors indexed by label ------------------------------------------------------------

struct Global {
  std::string labels;  // row-major order
  Shape shape;
  std::vector<double> v;

  Int size_of(char l) const { return shape[labels.find(l)]; }
  double at(const std::map<char, Int>& idx) const {
    Int flat = 0;
    for (std::size_t d = 0; d < labels.size(); ++d) flat = flat * shape[d] + idx.at(labels[d]);
    return v[static_cast<std::size_t>(flat)];
  }
};

std::string labels_of(const Layout& l) {
  std::string s;
  for (int d = 0; d < l.rank; ++d) s += l.dims[d].label;
  return s;
}

// Builds a layout from labels and per-label axes, plus partial axes.
Layout make_layout(const std::string& labels, const std::map<char, std::vector<int>>& axes,
                   const std::vector<int>& partial) {
  Layout l;
  l.rank = static_cast<int>(labels.size());
  for (std::size_t d = 0; d < labels.size(); ++d) {
    l.dims[d].label = labels[d];
    const auto it = axes.find(labels[d]);
    if (it != axes.end())
      for (int a : it->second) l.dims[d].axes[static_cast<std::size_t>(l.dims[d].axis_count++)] = a;
  }
  for (int a : partial) l.partial[static_cast<std::size_t>(l.partial_count++)] = a;
  return l;
}

std::vector<int> partial_of(const Layout& l) {
  std::vector<int> p;
  for (int i = 0; i < l.partial_count; ++i) p.push_back(l.partial[i]);
  return p;
}

std::map<char, std::vector<int>> all_axes(const Layout& l) {
  std::map<char, std::vector<int>> m;
  for (int d = 0; d < l.rank; ++d) m[l.dims[d].label] = axes_of(l, l.dims[d].label);
  return m;
}

// --- cases --------------------------------------------------------------------------------------

enum class Op { merge, split, concat, slice, pad };
const char* op_name(Op op) {
  switch (op) {
    case Op::merge:
      return "merge";
    case Op::split:
      return "split";
    case Op::concat:
      return "concat";
    case Op::slice:
      return "slice";
    case Op::pad:
      return "pad";
  }
  return "?";
}

struct Operand {
  std::string labels;
  Shape shape;
  Layout layout;
};

struct Case {
  Op op = Op::merge;
  std::vector<int> sizes;
  std::vector<std::string> names;
  bool single = false;
  std::vector<Operand> in;
  char label = 0;          // the op's label (slice, pad, concat, split's source)
  std::string group;       // merge: labels merged; split: labels split into
  char merged = 0;         // merge: the new label
  Shape split_sizes;       // split
  Int begin = 0, end = 0;  // slice
  Int before = 0, after = 0;
  double value = 0;  // pad
  std::uint64_t salt = 0;
};

std::string describe(const Case& c, int index) {
  std::ostringstream s;
  s << "case #" << index << ": " << op_name(c.op) << " on mesh ";
  for (std::size_t i = 0; i < c.sizes.size(); ++i) s << (i ? "x" : "") << c.sizes[i];
  s << (c.single ? ", float" : ", double");
  switch (c.op) {
    case Op::merge:
      s << ", merge \"" << c.group << "\" -> '" << c.merged << "'";
      break;
    case Op::split:
      s << ", split '" << c.label << "' -> \"" << c.group << "\" " << list_text(c.split_sizes);
      break;
    case Op::concat:
      s << ", along '" << c.label << "'";
      break;
    case Op::slice:
      s << ", '" << c.label << "' [" << c.begin << ", " << c.end << ")";
      break;
    case Op::pad:
      s << ", '" << c.label << "' before " << c.before << " after " << c.after << " value "
        << c.value;
      break;
  }
  for (const auto& o : c.in)
    s << ", operand \"" << layout_text(o.layout, c.names) << "\" shape " << list_text(o.shape);
  s << ", salt " << c.salt;
  return s.str();
}

// A label's size: 0..9, often smaller than the shard counts.
Int random_size(Dice& dice) {
  if (dice.chance(5)) return 0;
  return dice.chance(40) ? dice.between(1, 3) : dice.between(1, 9);
}

Case random_case(Dice& dice, const std::vector<int>& sizes, const std::vector<std::string>& names,
                 std::uint64_t salt) {
  const int axis_count = static_cast<int>(sizes.size());
  std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  dice.shuffle(pool);
  std::size_t next = 0;
  auto fresh = [&] { return pool[next++]; };
  Case c;
  c.sizes = sizes;
  c.names = names;
  c.salt = salt;
  c.single = dice.chance(20);
  c.op = static_cast<Op>(salt % 5);  // round-robin: every op gets a fifth of the cases
  const int rank = c.op == Op::merge ? dice.between(2, 4) : dice.between(1, 4);
  std::string labels;
  for (int i = 0; i < rank; ++i) labels += fresh();
  std::map<char, Int> size;
  for (char l : labels) size[l] = random_size(dice);
  auto limit_sizes = [&](Int limit) {  // keeps the naive loops short
    for (;;) {
      Int p = 1;
      for (const auto& [l, s] : size) p *= std::max<Int>(1, s);
      if (p <= limit) return;
      auto big = std::max_element(size.begin(), size.end(),
                                  [](const auto& x, const auto& y) { return x.second < y.second; });
      big->second = std::max<Int>(1, big->second - 2);
    }
  };
  // The op's label: often split (a fixed axis list drawn first), else whatever random_layout does.
  auto layout_for = [&](const std::string& ls, char split_label) {
    std::map<char, std::vector<int>> fixed;
    if (split_label != 0 && dice.chance(60)) {
      std::vector<int> axes;
      for (int a = 0; a < axis_count; ++a)
        if (dice.chance(55)) axes.push_back(a);
      dice.shuffle(axes);
      if (!axes.empty()) fixed[split_label] = axes;
    }
    return random_layout(dice, ls, axis_count, fixed);
  };
  auto operand = [&](std::string ls, char split_label) {
    dice.shuffle(ls);
    Operand o;
    o.labels = ls;
    for (char l : ls) o.shape.push_back(size[l]);
    o.layout = layout_for(ls, split_label);
    return o;
  };
  switch (c.op) {
    case Op::merge: {
      const int m = dice.between(2, std::min(rank, 3));
      std::string shuffled = labels;
      dice.shuffle(shuffled);
      c.group = shuffled.substr(0, static_cast<std::size_t>(m));
      c.merged = dice.chance(30) ? c.group[static_cast<std::size_t>(dice.below(m))] : fresh();
      limit_sizes(400);
      // Often the natural case: merged labels adjacent and in order, only the major split.
      Operand o = operand(labels, c.group[0]);
      if (dice.chance(40)) {
        std::string rest;
        for (char l : labels)
          if (c.group.find(l) == std::string::npos) rest += l;
        const auto at = static_cast<std::size_t>(dice.below(static_cast<int>(rest.size()) + 1));
        o.labels = rest.substr(0, at) + c.group + rest.substr(at);
        o.shape.clear();
        for (char l : o.labels) o.shape.push_back(size[l]);
        std::map<char, std::vector<int>> fixed;
        std::vector<int> major;
        for (int a = 0; a < axis_count; ++a)
          if (dice.chance(50)) major.push_back(a);
        fixed[c.group[0]] = major;
        for (std::size_t i = 1; i < c.group.size(); ++i) fixed[c.group[i]] = {};
        o.layout = random_layout(dice, o.labels, axis_count, fixed);
      }
      c.in.push_back(o);
      break;
    }
    case Op::split: {
      c.label = labels[static_cast<std::size_t>(dice.below(rank))];
      const int m = dice.between(2, 3);
      for (int i = 0; i < m; ++i) {
        const char l = (i == 0 && dice.chance(25)) ? c.label : fresh();
        c.group += l;
        c.split_sizes.push_back(dice.chance(4) ? 0 : dice.between(1, i == 0 ? 7 : 4));
      }
      Int n = 1;
      for (auto s : c.split_sizes) n *= s;
      size[c.label] = n;
      limit_sizes(600);
      if (size[c.label] != n) {  // shrunk: shrink the parts alike
        c.split_sizes.assign(static_cast<std::size_t>(m), 1);
        c.split_sizes[0] = size[c.label];
      }
      c.in.push_back(operand(labels, c.label));
      break;
    }
    case Op::concat: {
      c.label = labels[static_cast<std::size_t>(dice.below(rank))];
      const int k = dice.chance(75) ? 2 : 3;
      limit_sizes(300);
      for (int i = 0; i < k; ++i) {
        size[c.label] = random_size(dice);
        c.in.push_back(operand(labels, c.label));
        if (i > 0 && dice.chance(35)) {  // often the same layout as the first
          const Layout& f = c.in[0].layout;
          Operand& o = c.in.back();
          o.labels = c.in[0].labels;
          o.shape.clear();
          for (char l : o.labels) o.shape.push_back(size[l]);
          o.layout = f;
          if (dice.chance(50)) {  // partial sums differ
            o.layout.partial_count = 0;
            for (int a = 0; a < axis_count; ++a)
              if (f.dim_on_axis(a) < 0 && dice.chance(40))
                o.layout.partial[static_cast<std::size_t>(o.layout.partial_count++)] = a;
          }
        }
      }
      break;
    }
    case Op::slice: {
      c.label = labels[static_cast<std::size_t>(dice.below(rank))];
      limit_sizes(500);
      const Int n = size[c.label];
      c.begin = dice.between(0, static_cast<int>(n));
      c.end = dice.between(static_cast<int>(c.begin), static_cast<int>(n));
      c.in.push_back(operand(labels, c.label));
      break;
    }
    case Op::pad: {
      c.label = labels[static_cast<std::size_t>(dice.below(rank))];
      limit_sizes(300);
      c.before = dice.between(0, 6);
      c.after = dice.between(0, 6);
      c.value = dice.chance(30) ? 0.0 : dyadic(mix(salt), 2, 2);
      c.in.push_back(operand(labels, c.label));
      break;
    }
  }
  return c;
}

// --- the rules, as this file reads design.md
// ------------------------------------------------------

Layout expected_layout(const Case& c) {
  const Layout& x = c.in[0].layout;
  switch (c.op) {
    case Op::merge: {
      std::string labels;
      std::map<char, std::vector<int>> axes = all_axes(x);
      std::vector<int> merged_axes;
      for (char l : c.group)
        for (int a : axes[l]) merged_axes.push_back(a);
      bool placed = false;
      for (char l : labels_of(x)) {
        if (c.group.find(l) == std::string::npos) {
          labels += l;
        } else if (!placed) {
          labels += c.merged;
          placed = true;
        }
      }
      for (char l : c.group) axes.erase(l);
      axes[c.merged] = merged_axes;
      return make_layout(labels, axes, partial_of(x));
    }
    case Op::split: {
      std::string labels;
      std::map<char, std::vector<int>> axes = all_axes(x);
      const std::vector<int> own = axes[c.label];
      axes.erase(c.label);
      for (char l : labels_of(x)) {
        if (l != c.label) {
          labels += l;
          continue;
        }
        labels += c.group;
      }
      axes[c.group[0]] = own;
      for (std::size_t i = 1; i < c.group.size(); ++i) axes[c.group[i]] = {};
      return make_layout(labels, axes, partial_of(x));
    }
    case Op::concat: {
      std::vector<int> partial = partial_of(x);
      for (const auto& o : c.in)
        for (int a : partial_of(o.layout))
          if (std::find(partial.begin(), partial.end(), a) == partial.end() &&
              x.dim_on_axis(a) < 0)  // an axis the result splits is finished in that operand
            partial.push_back(a);
      return make_layout(labels_of(x), all_axes(x), partial);
    }
    default:
      return x;
  }
}

// The result, as a global tensor, by a naive loop over its elements.
Global expected_values(const Case& c, const std::vector<Global>& in, const std::string& labels) {
  const Global& x = in[0];
  std::map<char, Int> size;
  for (std::size_t d = 0; d < x.labels.size(); ++d) size[x.labels[d]] = x.shape[d];
  switch (c.op) {
    case Op::merge: {
      Int n = 1;
      for (char l : c.group) n *= size[l];
      for (char l : c.group) size.erase(l);
      size[c.merged] = n;
      break;
    }
    case Op::split:
      size.erase(c.label);
      for (std::size_t i = 0; i < c.group.size(); ++i) size[c.group[i]] = c.split_sizes[i];
      break;
    case Op::concat: {
      Int n = 0;
      for (const auto& g : in) n += g.size_of(c.label);
      size[c.label] = n;
      break;
    }
    case Op::slice:
      size[c.label] = c.end - c.begin;
      break;
    case Op::pad:
      size[c.label] += c.before + c.after;
      break;
  }
  Global out;
  out.labels = labels;
  Int total = 1;
  for (char l : labels) {
    out.shape.push_back(size.at(l));
    total *= size.at(l);
  }
  out.v.assign(static_cast<std::size_t>(total), 0.0);
  std::map<char, Int> idx;
  for (Int flat = 0; flat < total; ++flat) {
    Int rest = flat;
    for (std::size_t d = labels.size(); d-- > 0;) {
      idx[labels[d]] = rest % out.shape[d];
      rest /= out.shape[d];
    }
    std::map<char, Int> src = idx;
    double v = 0;
    switch (c.op) {
      case Op::merge: {
        Int t = idx[c.merged];
        src.erase(c.merged);
        for (std::size_t i = c.group.size(); i-- > 0;) {  // the last label is the minor one
          const Int s = x.size_of(c.group[i]);
          src[c.group[i]] = t % s;
          t /= s;
        }
        v = x.at(src);
        break;
      }
      case Op::split: {
        Int t = 0;
        for (char l : c.group) {
          t = t * size[l] + idx[l];
          src.erase(l);
        }
        src[c.label] = t;
        v = x.at(src);
        break;
      }
      case Op::concat: {
        Int o = idx[c.label];
        for (const auto& g : in) {
          if (o < g.size_of(c.label)) {
            src[c.label] = o;
            v = g.at(src);
            break;
          }
          o -= g.size_of(c.label);
        }
        break;
      }
      case Op::slice:
        src[c.label] = idx[c.label] + c.begin;
        v = x.at(src);
        break;
      case Op::pad: {
        const Int o = idx[c.label] - c.before;
        if (o >= 0 && o < x.size_of(c.label)) {
          src[c.label] = o;
          v = x.at(src);
        } else {
          v = c.value;
        }
        break;
      }
    }
    out.v[static_cast<std::size_t>(flat)] = v;
  }
  return out;
}

// This rank's result block: padding zero on every copy; summed over the partial copies, each
// element equal to the naive value (shape ops move values; the summands are exact dyadics).
template <class T>
std::string check_values(const std::vector<T>& got, const Layout& l, const Global& ref,
                         const Grid& grid, const gshard::detail::MeshState& mesh) {
  std::vector<Int> global_of;
  std::vector<T> sum;
  std::string wrong =
      gshard::test::sum_partial_copies(got, l, ref.shape, grid, mesh, global_of, sum);
  for (std::size_t i = 0; i < sum.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const double want = ref.v[static_cast<std::size_t>(global_of[i])];
    if (std::abs(static_cast<double>(sum[i]) - want) > 1e-9) {
      std::ostringstream s;
      s << "local element " << i << " (global " << global_of[i] << ") is " << sum[i]
        << ", expected " << want;
      wrong = s.str();
    }
  }
  return wrong;
}

template <class T>
std::string run_case(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid,
                     int& moved_nothing) {
  using RT = gshard::detail::RuntimeTensor<T>;
  std::vector<Global> globals;
  std::vector<RT> ins;
  for (std::size_t i = 0; i < c.in.size(); ++i) {
    const Operand& o = c.in[i];
    Global g{
        o.labels, o.shape,
        random_global(gshard::detail::product(o.shape), c.salt, static_cast<int>(i), c.single)};
    ins.push_back(RT{o.layout, o.shape,
                     device_copy(shard_of<T>(o.layout, o.shape, g.v, grid, c.salt + i, c.single)),
                     gshard::ReduceOp::sum});
    globals.push_back(std::move(g));
  }
  gshard::comm_counters().reset();
  RT r;
  std::string threw;
  try {
    switch (c.op) {
      case Op::merge:
        r = gshard::detail::merge_runtime<T>(ins[0], c.group, c.merged, mesh, c.names);
        break;
      case Op::split:
        r = gshard::detail::split_runtime<T>(ins[0], c.label, c.group, c.split_sizes, mesh,
                                             c.names);
        break;
      case Op::concat:
        r = gshard::detail::concat_runtime<T>(ins, c.label, mesh, c.names);
        break;
      case Op::slice:
        r = gshard::detail::slice_runtime<T>(ins[0], c.label, c.begin, c.end, mesh, c.names);
        break;
      case Op::pad:
        r = gshard::detail::pad_runtime<T>(ins[0], c.label, c.before, c.after,
                                           static_cast<T>(c.value), mesh, c.names);
        break;
    }
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  const gshard::CommCount counted = gshard::comm_counters().total();
  const Layout want = expected_layout(c);
  std::string wrong;
  if (!(r.layout == want))
    wrong = "result layout \"" + layout_text(r.layout, c.names) + "\", the rules say \"" +
            layout_text(want, c.names) + "\"";
  const Global ref = expected_values(c, globals, labels_of(want));
  if (wrong.empty() && r.shape != ref.shape)
    wrong = "result shape " + list_text(r.shape) + ", expected " + list_text(ref.shape);
  // Slice and pad along a label that no axis splits move nothing between ranks.
  const bool local_only =
      (c.op == Op::slice || c.op == Op::pad) && axes_of(c.in[0].layout, c.label).empty();
  if (wrong.empty() && local_only && counted.calls != 0)
    wrong = std::to_string(counted.calls) + " collectives ran along an unsplit label";
  // At most one exchange of the op itself (plus the planner's reshards of the operands).
  const auto v = gshard::comm_counters().all();
  Int exchanges = 0;
  for (const auto& [key, count] : v)
    if (key.second == gshard::Collective::all_to_all_v) exchanges += count.calls;
  if (wrong.empty() && c.op != Op::merge && c.op != Op::concat && exchanges > 1)
    wrong = std::to_string(exchanges) + " AllToAllv calls, expected at most one";
  if (counted.calls == 0) ++moved_nothing;
  const bool usable = r.layout == want && r.shape == ref.shape;
  int all_usable = usable ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_usable != 0) {
    const std::string bad = check_values<T>(host_copy(r.data), r.layout, ref, grid, mesh);
    if (wrong.empty()) wrong = bad;
  }
  return wrong.empty() ? "" : wrong + " (result \"" + layout_text(r.layout, c.names) + "\")";
}

constexpr int total_random_cases = 1000;

}  // namespace

TEST_CASE("shape ops (run-time engines): random ops, layouts, sizes and meshes vs a naive loop") {
  const int n = world_size();
  const gshard::test::TestMeshes test_meshes(n);
  const std::vector<MeshUnderTest>& meshes = test_meshes.all;
  const int per_mesh =
      (total_random_cases + static_cast<int>(meshes.size()) - 1) / static_cast<int>(meshes.size());
  Dice dice(20250311);  // the same on every rank
  int cases = 0, failures = 0, reported = 0, moved_nothing = 0;
  std::map<std::string, int> per_op;
  int split_label = 0, partial = 0;
  for (const auto& m : meshes) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, m.sizes, m.names, static_cast<std::uint64_t>(cases) + 1);
      ++per_op[op_name(c.op)];
      const char l = c.op == Op::merge ? c.group[0] : c.label;
      bool any_split = false, any_partial = false;
      for (const auto& o : c.in) {
        any_split = any_split || !axes_of(o.layout, l).empty();
        any_partial = any_partial || o.layout.partial_count > 0;
      }
      split_label += any_split ? 1 : 0;
      partial += any_partial ? 1 : 0;
      const std::string wrong = c.single ? run_case<float>(c, *m.state, grid, moved_nothing)
                                         : run_case<double>(c, *m.state, grid, moved_nothing);
      if (!wrong.empty()) {
        ++failures;
        if (reported++ < 8)
          FAIL_CHECK(describe(c, cases)
                     << " at " << n << " ranks, rank " << world_rank() << ": " << wrong);
      }
      ++cases;
    }
  }
  if (world_rank() == 0) {
    std::ostringstream s;
    for (const auto& [op, k] : per_op) s << ' ' << op << ' ' << k;
    MESSAGE(cases << " random shape ops over " << meshes.size() << " meshes:" << s.str() << "; "
                  << split_label << " with the op's label split, " << partial
                  << " with partial operands, " << moved_nothing << " without communication");
  }
  CHECK(cases >= 1000);
  for (const auto& [op, k] : per_op) CHECK(k >= 100);
  CHECK(failures == 0);
}

// --- communication counts: one AllToAllv over the label's axes, exactly the bytes that cross ----

namespace {

using M = gshard::Mesh<"x", "y">;

// Each moved element: the rank holding it and its index along the result's line. The bytes this
// rank sends are the elements it holds whose result block (index / chunk) is another rank's, times
// `slab` elements of the other dimensions; `any` says whether any rank sends anything.
Int sent_bytes(const std::vector<std::pair<int, Int>>& moves, Int dest_chunk, Int slab,
               Int element_bytes, bool& any) {
  const int me = world_rank();
  Int bytes = 0;
  any = false;
  for (const auto& [holder, index] : moves) {
    const int owner = static_cast<int>(index / dest_chunk);
    if (owner == holder) continue;
    any = true;
    if (holder == me) bytes += slab * element_bytes;
  }
  return bytes;
}

Int ceil_of(Int a, Int b) { return (a + b - 1) / b; }

// The result's counters: one AllToAllv over x with `bytes` when anything moves, nothing else.
void check_one_exchange(bool any, Int bytes, const std::string& what) {
  INFO(what);
  const gshard::CommCount a2a = gshard::comm_counters().get("x", gshard::Collective::all_to_all_v);
  CHECK(gshard::comm_counters().total().calls == (any ? 1 : 0));
  CHECK(a2a.calls == (any ? 1 : 0));
  CHECK(a2a.bytes == bytes);
}

template <class S>
S iota(const M& mesh, const Shape& shape) {
  std::vector<double> g(static_cast<std::size_t>(gshard::detail::product(shape)));
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<double>(i) + 1.0;
  return gshard::from_global<S>(mesh, shape, g);
}

}  // namespace

TEST_CASE("shape ops along a split label: one AllToAllv of exactly the elements that cross ranks") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  using X = gshard::Sharded<double, M, "S:x C">;
  const Int C = 3;
  {  // slice [3, 11) of 13
    const X x = iota<X>(mesh, {13, C});
    std::vector<std::pair<int, Int>> moves;
    for (Int s = 3; s < 11; ++s) moves.push_back({static_cast<int>(s / ceil_of(13, n)), s - 3});
    bool any = false;
    const Int bytes = sent_bytes(moves, ceil_of(8, n), C, 8, any);
    gshard::comm_counters().reset();
    const X r = gshard::slice<"S">(x, 3, 11);
    check_one_exchange(any, bytes, "slice [3, 11) of 13 over x");
    CHECK(r.shape() == Shape{8, C});
  }
  {  // pad 13 by 5 before (a halo wider than a shard at 4 and 8 ranks) and 2 after
    const X x = iota<X>(mesh, {13, C});
    std::vector<std::pair<int, Int>> moves;
    for (Int s = 0; s < 13; ++s) moves.push_back({static_cast<int>(s / ceil_of(13, n)), s + 5});
    bool any = false;
    const Int bytes = sent_bytes(moves, ceil_of(20, n), C, 8, any);
    gshard::comm_counters().reset();
    const X r = gshard::pad<"S">(x, 5, 2, -1.0);
    check_one_exchange(any, bytes, "pad 13 by 5 and 2 over x");
    CHECK(r.shape() == Shape{20, C});
  }
  {  // concat 5 and 7: both operands in the one exchange
    const X a = iota<X>(mesh, {5, C});
    const X b = iota<X>(mesh, {7, C});
    std::vector<std::pair<int, Int>> moves;
    for (Int s = 0; s < 5; ++s) moves.push_back({static_cast<int>(s / ceil_of(5, n)), s});
    for (Int s = 0; s < 7; ++s) moves.push_back({static_cast<int>(s / ceil_of(7, n)), 5 + s});
    bool any = false;
    const Int bytes = sent_bytes(moves, ceil_of(12, n), C, 8, any);
    gshard::comm_counters().reset();
    const X r = gshard::concat<"S">(a, b);
    check_one_exchange(any, bytes, "concat 5 and 7 over x");
    CHECK(r.shape() == Shape{12, C});
  }
  using G = gshard::Sharded<double, M, "G:x S C">;
  using T = gshard::Sharded<double, M, "T:x C">;
  {  // merge 5x3 (blocks of ceil(5/n)*3 and ceil(15/n) differ for n = 2, 4, 8)
    const G x = iota<G>(mesh, {5, 3, C});
    std::vector<std::pair<int, Int>> moves;
    for (Int g = 0; g < 5; ++g)
      for (Int s = 0; s < 3; ++s) moves.push_back({static_cast<int>(g / ceil_of(5, n)), g * 3 + s});
    bool any = false;
    const Int bytes = sent_bytes(moves, ceil_of(15, n), C, 8, any);
    CHECK(any == (n > 1));
    gshard::comm_counters().reset();
    const T r = gshard::merge<"GS", "T">(x);
    check_one_exchange(any, bytes, "merge 5x3 over x");
    CHECK(r.shape() == Shape{15, C});
  }
  {  // merge 2n x 3: the blocks line up, nothing moves and nothing is copied
    const G x = iota<G>(mesh, {2 * n, 3, C});
    gshard::comm_counters().reset();
    const T r = gshard::merge<"GS", "T">(x);
    CHECK(gshard::comm_counters().total().calls == 0);
    CHECK(r.local_view().data() == x.local_view().data());
    // ...and split back: the same.
    const G back = gshard::split<"T", "GS">(r, {2 * n, 3});
    CHECK(gshard::comm_counters().total().calls == 0);
    CHECK(back.local_view().data() == x.local_view().data());
  }
  {  // split 15 into 5x3: T blocks of ceil(15/n), G blocks of ceil(5/n) rows of 3
    const T x = iota<T>(mesh, {15, C});
    std::vector<std::pair<int, Int>> moves;
    for (Int t = 0; t < 15; ++t) moves.push_back({static_cast<int>(t / ceil_of(15, n)), t});
    bool any = false;
    const Int bytes = sent_bytes(moves, ceil_of(5, n) * 3, C, 8, any);
    gshard::comm_counters().reset();
    const G r = gshard::split<"T", "GS">(x, {5, 3});
    check_one_exchange(any, bytes, "split 15 into 5x3 over x");
    CHECK(r.shape() == Shape{5, 3, C});
  }
  {  // slice and pad along an unsplit label: local
    using U = gshard::Sharded<double, M, "S C:x">;
    const U x = iota<U>(mesh, {6, 9});
    gshard::comm_counters().reset();
    (void)gshard::slice<"S">(x, 1, 4);
    (void)gshard::pad<"S">(x, 2, 9, 3.0);
    (void)gshard::concat<"S">(x, x);
    CHECK(gshard::comm_counters().total().calls == 0);
  }
}

// --- typed cases --------------------------------------------------------------------------------

namespace {

template <class S>
Global global_of(const S& s) {
  return {labels_of(S::layout), s.shape(), s.to_global()};
}

template <class S>
S random_typed(const M& mesh, const Grid& grid, const Shape& shape, std::uint64_t salt) {
  const std::vector<double> g = random_global(gshard::detail::product(shape), salt, 0, false);
  return S(mesh, shape, device_copy(shard_of<double>(S::layout, shape, g, grid, salt, false)));
}

template <class R>
void check_typed(const R& r, const std::string& spec, const Case& c, const std::vector<Global>& in,
                 const std::string& what) {
  INFO(what);
  CHECK(std::string(R::spec.view()) == spec);
  const Global ref = expected_values(c, in, labels_of(R::layout));
  CHECK(r.shape() == ref.shape);
  const std::vector<double> got = r.to_global();
  REQUIRE(got.size() == ref.v.size());
  std::string wrong;
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
    if (got[i] != ref.v[i])
      wrong = "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
              std::to_string(ref.v[i]);
  CHECK(wrong == "");
}

Case merge_case(const std::string& group, char merged) {
  Case c;
  c.op = Op::merge;
  c.group = group;
  c.merged = merged;
  return c;
}

Case label_case(Op op, char label) {
  Case c;
  c.op = op;
  c.label = label;
  return c;
}

}  // namespace

TEST_CASE("merge, split, concat, slice, pad: typed results, specs by the rules, values") {
  const int n = world_size();
  int cases = 0;
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    const Grid grid = grid_of({ax, n / ax}, world_rank());
    auto salt = [&] { return static_cast<std::uint64_t>(++cases) * 77; };
    {  // the major label split: the merged label keeps its axis
      using X = gshard::Sharded<double, M, "G:x S C">;
      const X x = random_typed<X>(mesh, grid, {5, 3, 2}, salt());
      check_typed(gshard::merge<"GS", "T">(x), "T:x C", merge_case("GS", 'T'), {global_of(x)},
                  "merge<GS,T> of G:x S C");
    }
    {  // labels in the other memory order: T takes S's place (first), a local transpose
      using X = gshard::Sharded<double, M, "S C G:x">;
      const X x = random_typed<X>(mesh, grid, {3, 2, 7}, salt());
      check_typed(gshard::merge<"GS", "T">(x), "T:x C", merge_case("GS", 'T'), {global_of(x)},
                  "merge<GS,T> of S C G:x");
    }
    {  // both split: T over both axes, the major's first
      using X = gshard::Sharded<double, M, "G:x S:y C">;
      const X x = random_typed<X>(mesh, grid, {3, 5, 2}, salt());
      check_typed(gshard::merge<"GS", "T">(x), "T:x*y C", merge_case("GS", 'T'), {global_of(x)},
                  "merge<GS,T> of G:x S:y C");
      check_typed(gshard::merge<"SG", "T">(x), "T:y*x C", merge_case("SG", 'T'), {global_of(x)},
                  "merge<SG,T> of G:x S:y C");
    }
    {  // three labels, the merged label reusing one of them; a pending partial sum stays
      using X = gshard::Sharded<double, M, "A B:y C D +x">;
      const X x = random_typed<X>(mesh, grid, {2, 3, 2, 3}, salt());
      check_typed(gshard::merge<"ABC", "B">(x), "B:y D +x", merge_case("ABC", 'B'), {global_of(x)},
                  "merge<ABC,B> of A B:y C D +x");
    }
    {  // a lazy operand
      using X = gshard::Sharded<double, M, "G:x S">;
      const X x = random_typed<X>(mesh, grid, {3, 3}, salt());
      const auto r = gshard::merge<"GS", "T">(x + x);
      const X twice = (x + x).eval();
      check_typed(r, "T:x", merge_case("GS", 'T'), {global_of(twice)}, "merge of x + x");
    }
    {  // split: the major new label takes the axes
      using X = gshard::Sharded<double, M, "C T:y">;
      const X x = random_typed<X>(mesh, grid, {2, 15}, salt());
      Case c = label_case(Op::split, 'T');
      c.group = "GS";
      c.split_sizes = {3, 5};
      check_typed(gshard::split<"T", "GS">(x, {3, 5}), "C G:y S", c, {global_of(x)},
                  "split<T,GS> of C T:y");
      c.group = "TAB";
      c.split_sizes = {5, 1, 3};
      check_typed(gshard::split<"T", "TAB">(x, {5, 1, 3}), "C T:y A B", c, {global_of(x)},
                  "split<T,TAB> of C T:y");
    }
    {  // concat: the first operand's layout; the second split otherwise and in another order
      using A = gshard::Sharded<double, M, "S:x C">;
      using B = gshard::Sharded<double, M, "C S:y">;
      const A a = random_typed<A>(mesh, grid, {5, 2}, salt());
      const B b = random_typed<B>(mesh, grid, {2, 4}, salt());
      check_typed(gshard::concat<"S">(a, b), "S:x C", label_case(Op::concat, 'S'),
                  {global_of(a), global_of(b)}, "concat<S> of S:x C and C S:y");
      check_typed(gshard::concat<"S">(b, a, b), "C S:y", label_case(Op::concat, 'S'),
                  {global_of(b), global_of(a), global_of(b)}, "concat<S> of three");
    }
    {  // concat with pending partial sums over different axes: both stay pending
      using A = gshard::Sharded<double, M, "S C +x">;
      using B = gshard::Sharded<double, M, "S C +y">;
      const A a = random_typed<A>(mesh, grid, {3, 2}, salt());
      const B b = random_typed<B>(mesh, grid, {2, 2}, salt());
      check_typed(gshard::concat<"S">(a, b), "S C +x +y", label_case(Op::concat, 'S'),
                  {global_of(a), global_of(b)}, "concat<S> of +x and +y");
    }
    {  // slice and pad keep the layout; pad's value is counted once over partial copies
      using X = gshard::Sharded<double, M, "S:y C +x">;
      const X x = random_typed<X>(mesh, grid, {7, 2}, salt());
      Case s = label_case(Op::slice, 'S');
      s.begin = 2;
      s.end = 6;
      check_typed(gshard::slice<"S">(x, 2, 6), "S:y C +x", s, {global_of(x)}, "slice [2, 6)");
      Case p = label_case(Op::pad, 'S');
      p.before = 4;
      p.after = 1;
      p.value = 1.5;
      check_typed(gshard::pad<"S">(x, 4, 1, 1.5), "S:y C +x", p, {global_of(x)}, "pad 4, 1");
    }
  }
  if (world_rank() == 0) MESSAGE(cases << " typed operands");
}

// --- errors: the same gshard::Error on every rank, before any collective
// ---------------------------

namespace {

template <class F>
void check_throws(F&& f, const std::vector<std::string>& parts) {
  gshard::comm_counters().reset();
  int threw = 0;
  std::string message;
  try {
    f();
  } catch (const gshard::Error& e) {
    threw = 1;
    message = e.what();
  }
  CHECK(threw == 1);
  for (const auto& p : parts) CHECK_MESSAGE(message.find(p) != std::string::npos, message);
  CHECK(gshard::comm_counters().total().calls == 0);
  int everywhere = threw;
  MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(everywhere == world_size());
}

}  // namespace

TEST_CASE("shape op mistakes at run time throw gshard::Error naming op, sizes and layouts") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  using X = gshard::Sharded<double, M, "S:x C">;
  const X x = iota<X>(mesh, {6, 2});
  check_throws([&] { (void)gshard::slice<"S">(x, 2, 9); },
               {"slice<\"S\">", "[2, 9)", "[0, 6)", "[6, 2]", "\"S:x C\""});
  check_throws([&] { (void)gshard::slice<"S">(x, 4, 3); }, {"slice<\"S\">", "[4, 3)"});
  check_throws([&] { (void)gshard::pad<"S">(x, -1, 2); }, {"pad<\"S\">", "-1", "[6, 2]"});
  check_throws(
      [&] {
        (void)gshard::split<"S", "AB">(x, {4, 2});
      },
      {"split<\"S\", \"AB\">", "[4, 2]", "size 6", "\"S:x C\""});
  check_throws([&] { (void)gshard::split<"S", "AB">(x, {6}); }, {"split<\"S\", \"AB\">"});
  const X y = iota<X>(mesh, {6, 3});
  check_throws([&] { (void)gshard::concat<"S">(x, y); },
               {"concat<\"S\">", "[6, 2]", "[6, 3]", "'S'"});
  // The run-time engine checks labels as well (the typed API does at compile time).
  const auto rx = gshard::detail::runtime_tensor(x);
  check_throws(
      [&] {
        (void)gshard::detail::merge_runtime<double>(rx, "SQ", 'T', gshard::detail::mesh_state(mesh),
                                                    gshard::detail::axis_name_list<M>());
      },
      {"merge<\"SQ\", \"T\">", "'Q'"});
}
