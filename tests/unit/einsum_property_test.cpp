// Einsum, property-based: over a thousand random unary and binary einsums through the run-time
// engine (gshard::detail::einsum_runtime, the cost model choosing each plan), each checked
// against a naive single-rank loop over the global operands; then typed cases through
// gshard::einsum<"...">(), whose result types are checked against spec strings derived by hand from
// the rules of core/einsum.hpp; then sizes that disagree.
//
// Every rank draws the same cases from the same seed (SPMD). Operand shards are built by us from
// global arrays with our own block arithmetic (ceil-sized blocks, zero padding); for a partial
// operand the global value is split into random summands over the partial coordinates. Values
// are dyadic rationals small enough that every sum is exact in the element type, so the
// tolerances (1e-12 relative for double, 1e-5 for float, relative to the sum of |terms|) only
// absorb the order of summation. A result's padding must hold zeros on every copy; a partial
// result is summed over its partial axes before the comparison.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "block_reference.hpp"
#include "mpi_test.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::test::axes_of;
using gshard::test::list_text;
using gshard::test::MeshUnderTest;
using gshard::test::sizes_text;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

// --- our own geometry ---------------------------------------------------------------------------

using gshard::test::block1;
using gshard::test::Block1;
using gshard::test::device_copy;
using gshard::test::Dice;
using gshard::test::dyadic;
using gshard::test::find_label;
using gshard::test::for_block;
using gshard::test::Grid;
using gshard::test::grid_of;
using gshard::test::host_copy;
using gshard::test::layout_text;
using gshard::test::mix;
using gshard::test::random_global;
using gshard::test::random_layout;
using gshard::test::shard_of;
using gshard::test::value_bits;

// --- the naive reference ------------------------------------------------------------------------

struct Reference {
  std::vector<double> value;  // row-major in `out` order
  std::vector<double> mag;    // sum of |terms| of each element, the scale of the tolerance
};

// out[o] = sum over every other label of a[..] * b[..] (b may be absent), one term at a time.
Reference naive(const std::string& out, const std::string& a_labels, const Shape& a_shape,
                const std::vector<double>& a, const std::string* b_labels, const Shape* b_shape,
                const std::vector<double>* b) {
  std::string all = out;
  for (char c : a_labels)
    if (all.find(c) == std::string::npos) all += c;
  if (b_labels != nullptr)
    for (char c : *b_labels)
      if (all.find(c) == std::string::npos) all += c;
  const std::size_t n = all.size();
  std::vector<Int> size(n, 0), sa(n, 0), sb(n, 0), so(n, 0);
  auto strides = [&](const std::string& labels, const Shape& shape, std::vector<Int>& st) {
    Int s = 1;
    for (std::size_t d = labels.size(); d-- > 0;) {
      const std::size_t at = all.find(labels[d]);
      st[at] = s;
      size[at] = shape[d];
      s *= shape[d];
    }
  };
  strides(a_labels, a_shape, sa);
  if (b_labels != nullptr) strides(*b_labels, *b_shape, sb);
  Int out_size = 1;
  for (std::size_t d = out.size(); d-- > 0;) {
    so[d] = out_size;
    out_size *= size[d];
  }
  Reference r{std::vector<double>(static_cast<std::size_t>(out_size), 0.0),
              std::vector<double>(static_cast<std::size_t>(out_size), 0.0)};
  Int total = 1;
  for (auto s : size) total *= s;
  std::vector<Int> idx(n, 0);
  for (Int t = 0; t < total; ++t) {
    Int ia = 0, ib = 0, io = 0;
    for (std::size_t d = 0; d < n; ++d) {
      ia += idx[d] * sa[d];
      ib += idx[d] * sb[d];
      io += idx[d] * so[d];
    }
    const double term =
        a[static_cast<std::size_t>(ia)] * (b != nullptr ? (*b)[static_cast<std::size_t>(ib)] : 1.0);
    r.value[static_cast<std::size_t>(io)] += term;
    r.mag[static_cast<std::size_t>(io)] += std::abs(term);
    for (std::size_t d = n; d-- > 0;) {  // odometer
      if (++idx[d] < size[d]) break;
      idx[d] = 0;
    }
  }
  return r;
}

// --- describing a case (our own printer) --------------------------------------------------------

// --- random cases -------------------------------------------------------------------------------

struct Operand {
  std::string labels;  // memory order
  Shape shape;         // in memory order
  Layout layout;
};

struct Case {
  std::vector<int> sizes;
  std::vector<std::string> names;
  bool binary = true;
  bool single = false;  // float instead of double
  std::string text;     // "ab,bc->ac"; the terms' label order is independent of the layouts'
  std::string out;      // the output term
  Operand a, b;
  std::uint64_t salt = 0;
};

Case random_case(Dice& dice, const std::vector<int>& sizes, const std::vector<std::string>& names,
                 std::uint64_t salt) {
  const int axis_count = static_cast<int>(sizes.size());
  std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
  dice.shuffle(pool);
  std::size_t next = 0;
  auto fresh = [&] { return pool[next++]; };
  Case c;
  c.sizes = sizes;
  c.names = names;
  c.salt = salt;
  c.binary = dice.chance(70);
  c.single = dice.chance(25);
  std::string ta, tb;
  if (c.binary) {
    const int na = dice.between(1, 5);
    const int nb = dice.between(1, 5);
    const int most = std::min(na, nb);
    const int shared = dice.chance(85) ? dice.between(1, most) : dice.between(0, most);
    for (int i = 0; i < shared; ++i) {
      const char l = fresh();
      ta += l;
      tb += l;
      if (dice.chance(50)) c.out += l;  // batch; else contracting
    }
    for (int i = shared; i < na; ++i) {
      const char l = fresh();
      ta += l;
      if (dice.chance(70)) c.out += l;  // free; else summed away
    }
    for (int i = shared; i < nb; ++i) {
      const char l = fresh();
      tb += l;
      if (dice.chance(70)) c.out += l;
    }
  } else {
    const int na = dice.between(1, 5);
    for (int i = 0; i < na; ++i) {
      const char l = fresh();
      ta += l;
      if (dice.chance(65)) c.out += l;
    }
  }
  dice.shuffle(c.out);
  if (c.out.size() > static_cast<std::size_t>(gshard::max_dims)) c.out.resize(gshard::max_dims);
  // Sizes: 1..7, often small (smaller than the shard counts); the naive loop stays short.
  std::map<char, Int> size;
  std::string all = ta + tb;
  for (char l : all)
    if (size.find(l) == size.end())
      size[l] = dice.chance(35) ? dice.between(1, 3) : dice.between(1, 7);
  const Int limit = c.single ? 2000 : 6000;
  for (;;) {
    Int p = 1;
    for (const auto& [l, s] : size) p *= s;
    if (p <= limit) break;
    auto big = std::max_element(size.begin(), size.end(),
                                [](const auto& x, const auto& y) { return x.second < y.second; });
    big->second = std::max<Int>(1, big->second - 2);
  }
  // Operands: random memory order, independent of the einsum terms' order.
  c.a.labels = ta;
  dice.shuffle(c.a.labels);
  c.a.layout = random_layout(dice, c.a.labels, axis_count, {});
  for (char l : c.a.labels) c.a.shape.push_back(size[l]);
  if (c.binary) {
    c.b.labels = tb;
    dice.shuffle(c.b.labels);
    std::map<char, std::vector<int>> fixed;
    if (dice.chance(45)) {  // often the shared labels already agree: the no-communication cases
      for (char l : c.b.labels)
        if (ta.find(l) != std::string::npos && dice.chance(80)) fixed[l] = axes_of(c.a.layout, l);
    }
    c.b.layout = random_layout(dice, c.b.labels, axis_count, fixed);
    for (char l : c.b.labels) c.b.shape.push_back(size[l]);
  }
  dice.shuffle(ta);
  dice.shuffle(tb);
  c.text = ta + (c.binary ? "," + tb : std::string()) + "->" + c.out;
  return c;
}

std::string describe(const Case& c, int index) {
  std::ostringstream s;
  s << "case #" << index << ": mesh " << sizes_text(c.sizes) << " (axes";
  for (const auto& n : c.names) s << ' ' << n;
  s << "), " << (c.single ? "float" : "double") << ", einsum \"" << c.text << "\", A \""
    << layout_text(c.a.layout, c.names) << "\" shape " << list_text(c.a.shape);
  if (c.binary)
    s << ", B \"" << layout_text(c.b.layout, c.names) << "\" shape " << list_text(c.b.shape);
  s << " (shapes in layout order), salt " << c.salt;
  return s.str();
}

// --- checking a result --------------------------------------------------------------------------

// The result's layout: the rules' output, well formed (labels in output order, no axis twice),
// and consistent with the rules' text: an output label keeps its axes from an operand or
// replicates; a partial axis comes from a label the output drops or from a pending partial sum.
std::string check_layout(const Layout& got, const Layout& rules_out, const Case& c) {
  const auto names = c.names;
  if (!(got == rules_out))
    return "result layout \"" + layout_text(got, names) + "\" differs from infer_einsum's \"" +
           layout_text(rules_out, names) + "\"";
  if (got.rank != static_cast<int>(c.out.size())) return "result rank " + std::to_string(got.rank);
  const int axis_count = static_cast<int>(c.sizes.size());
  std::vector<int> uses(static_cast<std::size_t>(axis_count), 0);
  auto use = [&](int a) {
    if (a < 0 || a >= axis_count) return false;
    ++uses[static_cast<std::size_t>(a)];
    return true;
  };
  for (int d = 0; d < got.rank; ++d) {
    const char l = c.out[static_cast<std::size_t>(d)];
    if (got.dims[d].label != l)
      return "result dimension " + std::to_string(d) + " is labelled '" +
             std::string(1, got.dims[d].label) + "', the einsum's output says '" + l + "'";
    std::vector<int> axes;
    for (int i = 0; i < got.dims[d].axis_count; ++i) {
      const int a = got.dims[d].axes[static_cast<std::size_t>(i)];
      if (!use(a))
        return "result dimension " + std::to_string(d) + " names axis " + std::to_string(a);
      axes.push_back(a);
    }
    if (!axes.empty() && axes != axes_of(c.a.layout, l) &&
        !(c.binary && axes == axes_of(c.b.layout, l)))
      return std::string("result label '") + l + "' is split over axes no operand gave it";
  }
  for (int i = 0; i < got.partial_count; ++i) {
    const int a = got.partial[static_cast<std::size_t>(i)];
    if (!use(a)) return "result partial axis " + std::to_string(a) + " out of range";
    bool source = c.a.layout.is_partial(a) || (c.binary && c.b.layout.is_partial(a));
    auto dropped_on = [&](const Layout& l) {
      for (int d = 0; d < l.rank; ++d)
        if (c.out.find(l.dims[d].label) == std::string::npos && l.dims[d].uses(a)) return true;
      return false;
    };
    source = source || dropped_on(c.a.layout) || (c.binary && dropped_on(c.b.layout));
    if (!source)
      return "result is partial over " + names[static_cast<std::size_t>(a)] +
             ", which no dropped label and no pending partial sum gave it";
  }
  for (int a = 0; a < axis_count; ++a)
    if (uses[static_cast<std::size_t>(a)] > 1)
      return "result layout \"" + layout_text(got, names) + "\" uses axis " +
             names[static_cast<std::size_t>(a)] + " twice";
  return "";
}

// The result's local block: padding zero on every copy, then (summed over the partial axes)
// each element within the tolerance of the naive value.
template <class T>
std::string check_values(const std::vector<T>& got, const Layout& l, const Shape& shape,
                         const Reference& ref, const Grid& grid,
                         const gshard::detail::MeshState& mesh, double tolerance) {
  std::vector<Int> global_of;
  std::vector<T> sum;
  std::string wrong = gshard::test::sum_partial_copies(got, l, shape, grid, mesh, global_of, sum);
  const bool mask = l.partial_count > 0;
  for (std::size_t i = 0; i < sum.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const auto g = static_cast<std::size_t>(global_of[i]);
    const double v = static_cast<double>(sum[i]);
    if (!(std::abs(v - ref.value[g]) <= tolerance * ref.mag[g])) {
      std::ostringstream s;
      s.precision(17);
      s << "local element " << i << " (global " << g << ")"
        << (mask ? " summed over partial copies" : "") << " is " << v << ", expected "
        << ref.value[g] << " (sum of |terms| " << ref.mag[g] << ")";
      wrong = s.str();
    }
  }
  return wrong;
}

template <class T>
std::string run_case(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid,
                     int& no_comm_cases, int& cost_planned_cases) {
  const gshard::EinsumParse p = gshard::parse_einsum(c.text);
  if (p.error != gshard::EinsumError::none) return "the test's einsum does not parse";
  const std::vector<double> ga =
      random_global(gshard::detail::product(c.a.shape), c.salt, 0, c.single);
  const std::vector<double> gb =
      c.binary ? random_global(gshard::detail::product(c.b.shape), c.salt, 1, c.single)
               : std::vector<double>{};
  using RT = gshard::detail::RuntimeTensor<T>;
  const RT a{c.a.layout, c.a.shape,
             device_copy(shard_of<T>(c.a.layout, c.a.shape, ga, grid, c.salt, c.single)),
             gshard::ReduceOp::sum};
  RT b{};
  if (c.binary)
    b = RT{c.b.layout, c.b.shape,
           device_copy(shard_of<T>(c.b.layout, c.b.shape, gb, grid, c.salt ^ 0x5555, c.single)),
           gshard::ReduceOp::sum};
  const gshard::EinsumLayouts rules =
      gshard::infer_einsum(p.spec, c.a.layout, c.binary ? c.b.layout : Layout{});
  // What the einsum may move: the reshards of its operands to the layouts its plan gives them
  // (the rules' or, for a binary einsum, the cost model's), and then its result's to the rules'.
  gshard::EinsumLayouts plan = rules;
  bool by_rules = true;
  if (c.binary) {
    const auto choice =
        gshard::detail::choose_einsum_layouts(p.spec, rules, c.a.layout, c.a.shape, c.b.layout,
                                              c.b.shape, mesh.sizes, c.names, Int{sizeof(T)});
    plan = choice.compute;
    by_rules = choice.by_rules;
  }
  if (!by_rules) ++cost_planned_cases;
  auto bytes = [&](const Layout& from, const Layout& to, const Shape& shape) {
    return gshard::detail::plan_reshard(from, to, shape, mesh.sizes, mesh.coords, c.names,
                                        Int{sizeof(T)})
        .bytes();
  };
  Int planned = bytes(c.a.layout, plan.operands[0], c.a.shape);
  bool already = c.a.layout == rules.operands[0];
  if (c.binary) {
    already = already && c.b.layout == rules.operands[1];
    planned += bytes(c.b.layout, plan.operands[1], c.b.shape);
  }
  gshard::comm_counters().reset();
  RT r;
  std::string threw;
  try {
    r = gshard::detail::einsum_runtime<T>(c.text, p.spec, mesh, c.names, a,
                                          c.binary ? &b : nullptr);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  const gshard::CommCount counted = gshard::comm_counters().total();
  const std::string result_text = " (result \"" + layout_text(r.layout, c.names) + "\")";
  std::string wrong = check_layout(r.layout, rules.output, c);
  Shape expect_shape;
  for (char l : c.out) {
    const int d = find_label(c.a.layout, l);
    expect_shape.push_back(d >= 0 ? c.a.shape[static_cast<std::size_t>(d)]
                                  : c.b.shape[static_cast<std::size_t>(find_label(c.b.layout, l))]);
  }
  if (wrong.empty() && r.shape != expect_shape)
    wrong = "result shape " + list_text(r.shape) + ", expected " + list_text(expect_shape);
  if (wrong.empty() && already && counted.calls != 0)
    wrong = "the operands already had the rules' layouts, yet " + std::to_string(counted.calls) +
            " collectives ran";
  if (!by_rules) planned += bytes(plan.output, rules.output, expect_shape);
  if (wrong.empty() && counted.bytes != planned)
    wrong = "counters show " + std::to_string(counted.bytes) + " bytes, the plan's reshards " +
            std::to_string(planned);
  if (already) ++no_comm_cases;
  const Reference ref = naive(c.out, c.a.labels, c.a.shape, ga, c.binary ? &c.b.labels : nullptr,
                              c.binary ? &c.b.shape : nullptr, c.binary ? &gb : nullptr);
  // Values are checked on the result's own layout even when something above is wrong (as long as
  // it is usable), so that every rank takes part in the partial sum.
  const bool usable = r.layout.rank == static_cast<int>(c.out.size()) && r.shape == expect_shape;
  int all_usable = usable ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &all_usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (all_usable != 0) {
    const std::string v = check_values<T>(host_copy(r.data), r.layout, r.shape, ref, grid, mesh,
                                          c.single ? 1e-5 : 1e-12);
    if (wrong.empty()) wrong = v;
  }
  return wrong.empty() ? "" : wrong + result_text;
}

constexpr int total_random_cases = 1200;

}  // namespace

TEST_CASE("einsum (run-time engine): random einsums, layouts, shapes and meshes vs a naive loop") {
  const int n = world_size();
  const gshard::test::TestMeshes test_meshes(n);
  const std::vector<MeshUnderTest>& meshes = test_meshes.all;
  const int per_mesh =
      (total_random_cases + static_cast<int>(meshes.size()) - 1) / static_cast<int>(meshes.size());
  Dice dice(20240917);  // the same on every rank: every rank draws the same cases
  int cases = 0, failures = 0, reported = 0;
  int unary = 0, single = 0, partial_in = 0, partial_out = 0, no_comm = 0, cost_planned = 0;
  for (const auto& m : meshes) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, m.sizes, m.names, static_cast<std::uint64_t>(cases) + 1);
      unary += c.binary ? 0 : 1;
      single += c.single ? 1 : 0;
      partial_in +=
          (c.a.layout.partial_count > 0 || (c.binary && c.b.layout.partial_count > 0)) ? 1 : 0;
      {
        const gshard::EinsumParse p = gshard::parse_einsum(c.text);
        partial_out += gshard::infer_einsum(p.spec, c.a.layout, c.binary ? c.b.layout : Layout{})
                                   .output.partial_count > 0
                           ? 1
                           : 0;
      }
      const std::string wrong = c.single
                                    ? run_case<float>(c, *m.state, grid, no_comm, cost_planned)
                                    : run_case<double>(c, *m.state, grid, no_comm, cost_planned);
      if (!wrong.empty()) {
        ++failures;
        if (reported++ < 8)
          FAIL_CHECK(describe(c, cases)
                     << " at " << n << " ranks, rank " << world_rank() << ": " << wrong);
      }
      ++cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(cases << " random einsums over " << meshes.size() << " meshes: " << unary << " unary, "
                  << single << " in float, " << partial_in << " with partial operands, "
                  << partial_out << " with partial results, " << no_comm
                  << " with operands already in place, " << cost_planned
                  << " on a plan of the cost model's other than the rules'");
  CHECK(cases >= 1000);
  if (n > 1) CHECK(cost_planned > 0);
  CHECK(failures == 0);
}

// --- typed cases --------------------------------------------------------------------------------

namespace {

using M = gshard::Mesh<"x", "y">;

std::string labels_of(const Layout& l) {
  std::string s;
  for (int d = 0; d < l.rank; ++d) s += l.dims[d].label;
  return s;
}

// Sizes of the typed cases' labels: uneven, and some smaller than the shard counts.
Int typed_size(char label) {
  switch (label) {
    case 'G':
      return 3;
    case 'S':
      return 5;
    case 'M':
      return 6;
    case 'E':
      return 7;
    case 'H':
      return 2;
    case 'I':
      return 5;
    case 'J':
      return 3;
    case 'K':
      return 7;
    case 'B':
      return 3;
    case 'A':
      return 4;
    default:
      return 4;
  }
}

template <class S>
S typed_operand(const M& mesh, const Grid& grid, std::uint64_t salt, std::vector<double>& global) {
  Shape shape;
  for (int d = 0; d < S::layout.rank; ++d) shape.push_back(typed_size(S::layout.dims[d].label));
  global = random_global(gshard::detail::product(shape), salt, 0, false);
  return S(mesh, shape, device_copy(shard_of<double>(S::layout, shape, global, grid, salt, false)));
}

// The whole result against the naive loop; the result's spec against the one the rules give.
template <class R>
void check_typed(const R& r, const std::string& expected_spec, const std::string& what,
                 const Reference& ref, const std::string& out) {
  INFO(what);
  CHECK(std::string(R::spec.view()) == expected_spec);
  CHECK(labels_of(R::layout) == out);
  Shape shape;
  for (char l : out) shape.push_back(typed_size(l));
  CHECK(r.shape() == shape);
  const std::vector<double> got = r.to_global();
  REQUIRE(got.size() == ref.value.size());
  std::string wrong;
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
    if (!(std::abs(got[i] - ref.value[i]) <= 1e-12 * ref.mag[i]))
      wrong = "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
              std::to_string(ref.value[i]);
  CHECK(wrong == "");
}

template <gshard::fixed_string E, gshard::fixed_string SA, gshard::fixed_string SB>
void typed_binary(const M& mesh, const Grid& grid, const std::string& expected, int& cases) {
  using A = gshard::Sharded<double, M, SA>;
  using B = gshard::Sharded<double, M, SB>;
  std::vector<double> ga, gb;
  const A a = typed_operand<A>(mesh, grid, 100 + static_cast<std::uint64_t>(cases), ga);
  const B b = typed_operand<B>(mesh, grid, 5000 + static_cast<std::uint64_t>(cases), gb);
  const std::string what = "einsum<\"" + std::string(E.view()) + "\">(\"" + std::string(SA.view()) +
                           "\", \"" + std::string(SB.view()) + "\") on mesh " +
                           sizes_text(grid.sizes);
  ++cases;
  const std::vector<double> a_before = host_copy(a.local_view());
  const std::vector<double> b_before = host_copy(b.local_view());
  const auto r = gshard::einsum<E>(a, b).eval();
  const std::string text(E.view());
  const std::string out = text.substr(text.find("->") + 2);
  const std::string la = labels_of(A::layout), lb = labels_of(B::layout);
  const Reference ref = naive(out, la, a.shape(), ga, &lb, &b.shape(), &gb);
  check_typed(r, expected, what, ref, out);
  CHECK(host_copy(a.local_view()) == a_before);  // the operands are untouched
  CHECK(host_copy(b.local_view()) == b_before);
}

template <gshard::fixed_string E, gshard::fixed_string SA>
void typed_unary(const M& mesh, const Grid& grid, const std::string& expected, int& cases) {
  using A = gshard::Sharded<double, M, SA>;
  std::vector<double> ga;
  const A a = typed_operand<A>(mesh, grid, 100 + static_cast<std::uint64_t>(cases), ga);
  const std::string what = "einsum<\"" + std::string(E.view()) + "\">(\"" + std::string(SA.view()) +
                           "\") on mesh " + sizes_text(grid.sizes);
  ++cases;
  const auto r = gshard::einsum<E>(a).eval();
  const std::string text(E.view());
  const std::string out = text.substr(text.find("->") + 2);
  const Reference ref = naive(out, labels_of(A::layout), a.shape(), ga, nullptr, nullptr, nullptr);
  check_typed(r, expected, what, ref, out);
}

}  // namespace

TEST_CASE(
    "einsum<\"...\">(): typed cases, result specs from the layout rules, values via to_global") {
  const int n = world_size();
  int cases = 0;
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const M mesh(MPI_COMM_WORLD, {ax, n / ax});
    const Grid grid = grid_of({ax, n / ax}, world_rank());
    // MoE-style dispatch/expert contraction. E only in B: B's y; G: A's x; M contracts, unsplit.
    typed_binary<"GSM,EMH->EGSH", "G:x S M", "E:y M H">(mesh, grid, "E:y G:x S H", cases);
    // M split on y in both: contracted over y, the result partial over y.
    typed_binary<"GSM,EMH->EGSH", "G:x S M:y", "E M:y H">(mesh, grid, "E G:x S H +y", cases);
    // Free labels of B keep B's axes, whatever A does.
    typed_binary<"GSM,EMH->EGSH", "G S M", "E:x M H:y">(mesh, grid, "E:x G S H:y", cases);
    // Operand labels in another memory order than the einsum's terms.
    typed_binary<"GSM,EMH->EGSH", "M S:y G", "H E:x M">(mesh, grid, "E:x G S:y H", cases);
    // K split in the first operand only: B is sliced, the result is partial over x.
    typed_binary<"IK,KJ->IJ", "I K:x", "K J">(mesh, grid, "I J +x", cases);
    // K split in the second operand only: the first operand's K is unsplit, so B's y is taken.
    typed_binary<"IK,KJ->IJ", "I K", "K:y J">(mesh, grid, "I J +y", cases);
    // K split the same way in both, J keeps B's y.
    typed_binary<"IK,KJ->IJ", "I K:x", "K:x J:y">(mesh, grid, "I J:y +x", cases);
    // K split differently: the first operand wins, B is resharded to K:x.
    typed_binary<"IK,KJ->IJ", "I K:x", "K:y J">(mesh, grid, "I J +x", cases);
    // K over two axes: partial over both, in K's axis order.
    typed_binary<"IK,KJ->IJ", "I K:y*x", "K J">(mesh, grid, "I J +y +x", cases);
    // I takes x first; J's x is taken, so J is replicated (B gathers J).
    typed_binary<"IK,KJ->IJ", "I:x K", "K J:x">(mesh, grid, "I:x J", cases);
    // I takes x, J takes y; then K's y (A) is taken: K is replicated, nothing partial.
    typed_binary<"IK,KJ->IJ", "I:x K:y", "K J:y">(mesh, grid, "I:x J:y", cases);
    // Output order J I: J is handled first and takes x, then I's x is taken.
    typed_binary<"IK,KJ->JI", "I:x K", "K J:x">(mesh, grid, "J:x I", cases);
    // Transposed output keeps each label's axes.
    typed_binary<"IK,KJ->JI", "I:x K", "K J:y">(mesh, grid, "J:y I:x", cases);
    // Batch split the same way in both: no communication, the result keeps it.
    typed_binary<"BIK,BKJ->BIJ", "B:x I K", "B:x K J">(mesh, grid, "B:x I J", cases);
    // Batch split on different axes: the first operand's axis wins.
    typed_binary<"BIK,BKJ->BIJ", "B:x I K", "B:y K J">(mesh, grid, "B:x I J", cases);
    // Batch over both axes.
    typed_binary<"BIK,BKJ->BIJ", "B:x*y I K", "B K J">(mesh, grid, "B:x*y I J", cases);
    // Batch unsplit in A: B's axis is taken.
    typed_binary<"BIK,BKJ->BIJ", "B I:x K:y", "B:y K J">(mesh, grid, "B:y I:x J", cases);
    // A pending partial sum of A stays pending (no label uses x, B is not partial over x).
    typed_binary<"IK,KJ->IJ", "I K +x", "K J:y">(mesh, grid, "I J:y +x", cases);
    // A pending partial sum over an axis the output takes is finished first.
    typed_binary<"IK,KJ->IJ", "I K +y", "K J:y">(mesh, grid, "I J:y", cases);
    // Both operands partial over different axes: both stay pending, A's first.
    typed_binary<"IK,KJ->IJ", "I K +x", "K J +y">(mesh, grid, "I J +x +y", cases);
    // A label of A summed away while split: partial over its axis, after K's.
    typed_binary<"IKA,KJ->IJ", "I K A:y", "K:x J">(mesh, grid, "I J +x +y", cases);
    // Outer product.
    typed_binary<"I,J->IJ", "I:x", "J:y">(mesh, grid, "I:x J:y", cases);
    // Unary: G keeps x, S (split on y) is summed away: partial over y.
    typed_unary<"GSM->MG", "G:x S:y M">(mesh, grid, "M G:x +y", cases);
    // Unary: S keeps y, G summed away over x.
    typed_unary<"GSM->S", "G:x S:y M">(mesh, grid, "S:y +x", cases);
    // Unary: a pending partial sum stays pending.
    typed_unary<"GSM->S", "G S M +x">(mesh, grid, "S +x", cases);
    // A scalar result: a dot product, K's x split makes it partial over x.
    typed_binary<"K,K->", "K:x", "K">(mesh, grid, "+x", cases);
    // Unary transpose over a two-axis split.
    typed_unary<"GSM->MSG", "G:y*x S M">(mesh, grid, "M S G:y*x", cases);
  }
  if (world_rank() == 0) MESSAGE(cases << " typed einsums");
  CHECK(cases >= 27);
}

TEST_CASE("an einsum with more labels in a term than a layout holds is rejected by the parser") {
  // Layout holds at most gshard::max_dims (8) dimensions. The parser is the one gate of both the
  // typed einsum and einsum_runtime; a longer output term reaches infer_einsum, which writes
  // past Layout::dims (std::array<DimLayout, 8>) when it fills the output layout.
  CHECK(gshard::parse_einsum("ABCDE,FGHI->ABCDEFGHI").error != gshard::EinsumError::none);
  CHECK(gshard::parse_einsum("ABCDEFGH->ABCDEFGH").error == gshard::EinsumError::none);
}

TEST_CASE("einsum with label sizes that disagree throws gshard::Error on every rank") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  using A = gshard::Sharded<double, M, "I K:y">;
  using B = gshard::Sharded<double, M, "K J">;
  const A a = gshard::full<A>(mesh, {3, 4}, 1.0);
  const B b = gshard::full<B>(mesh, {5, 2}, 1.0);
  gshard::comm_counters().reset();
  int threw = 0;
  std::string message;
  try {
    (void)gshard::einsum<"IK,KJ->IJ">(a, b);
  } catch (const gshard::Error& e) {
    threw = 1;
    message = e.what();
  }
  CHECK(threw == 1);
  CHECK(message.find("label 'K'") != std::string::npos);
  CHECK(gshard::comm_counters().total().calls == 0);  // it throws before any collective
  int everywhere = threw;
  MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(everywhere == n);

  // A batch label through the run-time engine, operands in other memory orders.
  using BA = gshard::Sharded<double, M, "K B:y">;
  using BB = gshard::Sharded<double, M, "B J K">;
  const BA x = gshard::full<BA>(mesh, {4, 6}, 1.0);
  const BB y = gshard::full<BB>(mesh, {5, 2, 4}, 1.0);
  const gshard::EinsumParse p = gshard::parse_einsum("BK,BKJ->BJ");
  const auto rx = gshard::detail::runtime_tensor(x);
  const auto ry = gshard::detail::runtime_tensor(y);
  threw = 0;
  try {
    (void)gshard::detail::einsum_runtime<double>("BK,BKJ->BJ", p.spec,
                                                 gshard::detail::mesh_state(mesh),
                                                 gshard::detail::axis_name_list<M>(), rx, &ry);
  } catch (const gshard::Error& e) {
    threw = 1;
    message = e.what();
  }
  CHECK(threw == 1);
  CHECK(message.find("label 'B'") != std::string::npos);
  everywhere = threw;
  MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(everywhere == n);
}

// An operand with pending max (or min) partials: the einsum is not linear in such an operand, so
// the partials must be finished before contracting (or the einsum refused); they may never be
// carried into the result as a pending *sum*. Every copy holds the full value here, which is a
// valid max/min partial (the max of equal copies is the value).
TEST_CASE("einsum on an operand with pending max/min partials: finished first or refused") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  const Grid grid = grid_of({1, n}, world_rank());
  using A = gshard::Sharded<double, M, "I K +y">;
  using B = gshard::Sharded<double, M, "K J">;
  const Shape sa{3, 4}, sb{4, 2};
  const std::vector<double> ga = random_global(12, 91, 0, false);
  const std::vector<double> gb = random_global(8, 92, 1, false);
  Layout no_partial = A::layout;  // the same blocks, every copy holding the value
  no_partial.partial_count = 0;
  for (gshard::ReduceOp op : {gshard::ReduceOp::max, gshard::ReduceOp::min}) {
    const std::string what = op == gshard::ReduceOp::max ? "max" : "min";
    INFO("A \"I K +y\" with pending " << what << " partials, every copy the full value, mesh 1x"
                                      << n);
    A a(mesh, sa, device_copy(shard_of<double>(no_partial, sa, ga, grid, 0, false)));
    gshard::detail::set_partial_op(a, op);
    const B b = gshard::from_global<B>(mesh, sb, gb);
    REQUIRE(a.to_global() == ga);  // the library reads the copies as a max/min partial
    const std::string ij = "IJ";
    const std::string kj = "KJ";
    const Reference ref2 = naive(ij, "IK", sa, ga, &kj, &sb, &gb);
    int refused = 0;
    std::vector<double> got;
    try {
      got = gshard::einsum<"IK,KJ->IJ">(a, b).to_global();
    } catch (const gshard::Error&) {
      refused = 1;
    }
    int refused_anywhere = refused;
    MPI_Allreduce(MPI_IN_PLACE, &refused_anywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK((refused_anywhere == 0 || refused_anywhere == n));  // all or none
    if (refused == 0) {
      REQUIRE(got.size() == ref2.value.size());
      std::string wrong;
      for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
        if (!(std::abs(got[i] - ref2.value[i]) <= 1e-12 * ref2.mag[i]))
          wrong = "IK,KJ->IJ element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                  ", expected " + std::to_string(ref2.value[i]);
      CHECK(wrong == "");
    }
    // Unary: K summed away, the pending partial over y kept by the rules.
    refused = 0;
    try {
      got = gshard::einsum<"IK->I">(a).to_global();
    } catch (const gshard::Error&) {
      refused = 1;
    }
    refused_anywhere = refused;
    MPI_Allreduce(MPI_IN_PLACE, &refused_anywhere, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK((refused_anywhere == 0 || refused_anywhere == n));
    if (refused == 0) {
      const Reference r1 = naive("I", "IK", sa, ga, nullptr, nullptr, nullptr);
      REQUIRE(got.size() == r1.value.size());
      std::string wrong;
      for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
        if (!(std::abs(got[i] - r1.value[i]) <= 1e-12 * r1.mag[i]))
          wrong = "IK->I element " + std::to_string(i) + " is " + std::to_string(got[i]) +
                  ", expected " + std::to_string(r1.value[i]);
      CHECK(wrong == "");
    }
  }
}
