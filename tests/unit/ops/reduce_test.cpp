// Reductions (ops/reduce.hpp): random cases through the run-time engine
// (gshard::detail::reduce_runtime) against a naive single-rank loop over the global values, on
// every listed mesh shape, with random layouts (the reduced labels split, replicated; inputs
// partial) and uneven sizes; the result layout against the rules derived here by hand; the
// communication of every case against the count the rules promise; then exact comm counts of the
// typed API on split labels, typed cases, and errors.
//
// Input shards are built by the tests' own block arithmetic (tests/support). Values are dyadic,
// so sums and maxima are exact; exp/log/sqrt get a relative tolerance.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"
// Included after mpi_test.hpp, as every op header.
#include <gshard/ops/reduce.hpp>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::detail::Reduction;
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
using gshard::test::random_global;
using gshard::test::random_layout;
using gshard::test::shard_of;
using gshard::test::sizes_text;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

constexpr Reduction all_kinds[] = {Reduction::sum,       Reduction::mean,   Reduction::max,
                                   Reduction::min,       Reduction::argmax, Reduction::argmin,
                                   Reduction::logsumexp, Reduction::norm};

bool linear(Reduction k) { return k == Reduction::sum || k == Reduction::mean; }
bool arg(Reduction k) { return k == Reduction::argmax || k == Reduction::argmin; }
// AllReduces a finishing reduction runs over a split label.
int all_reduces(Reduction k) {
  switch (k) {
    case Reduction::max:
    case Reduction::min:
    case Reduction::norm:
      return 1;
    case Reduction::argmax:
    case Reduction::argmin:
    case Reduction::logsumexp:
      return 2;
    default:
      return 0;
  }
}

// --- the rules, written out by hand -------------------------------------------------------------

// Kept labels keep their axes in input order; a linear reduction is partial over the reduced
// labels' axes (input dimension order), then over the input's pending axes; the others are not
// partial at all.
Layout expected_layout(const Layout& in, const std::string& labels, Reduction k) {
  Layout out{};
  for (int d = 0; d < in.rank; ++d)
    if (labels.find(in.dims[d].label) == std::string::npos) out.dims[out.rank++] = in.dims[d];
  if (linear(k)) {
    for (int d = 0; d < in.rank; ++d)
      if (labels.find(in.dims[d].label) != std::string::npos)
        for (int i = 0; i < in.dims[d].axis_count; ++i)
          out.partial[static_cast<std::size_t>(out.partial_count++)] = in.dims[d].axes[i];
    for (int i = 0; i < in.partial_count; ++i)
      out.partial[static_cast<std::size_t>(out.partial_count++)] = in.partial[i];
  }
  return out;
}

// --- the naive reference ------------------------------------------------------------------------

// out[kept index, input order] over the reduced labels, visited row-major in `labels` order.
std::vector<double> naive(Reduction k, const std::string& in_labels, const Shape& shape,
                          const std::vector<double>& x, const std::string& labels) {
  std::vector<std::size_t> kept, red;
  for (std::size_t d = 0; d < in_labels.size(); ++d)
    if (labels.find(in_labels[d]) == std::string::npos) kept.push_back(d);
  for (char c : labels) red.push_back(in_labels.find(c));
  std::vector<Int> stride(in_labels.size());
  Int s = 1;
  for (std::size_t d = in_labels.size(); d-- > 0;) {
    stride[d] = s;
    s *= shape[d];
  }
  Int out_n = 1, red_n = 1;
  for (auto d : kept) out_n *= shape[d];
  for (auto d : red) red_n *= shape[d];
  std::vector<double> out(static_cast<std::size_t>(out_n));
  for (Int o = 0; o < out_n; ++o) {
    Int rest = o, base = 0;
    for (std::size_t j = kept.size(); j-- > 0;) {
      base += (rest % shape[kept[j]]) * stride[kept[j]];
      rest /= shape[kept[j]];
    }
    std::vector<double> v(static_cast<std::size_t>(red_n));
    for (Int r = 0; r < red_n; ++r) {
      Int rr = r, at = base;
      for (std::size_t j = red.size(); j-- > 0;) {
        at += (rr % shape[red[j]]) * stride[red[j]];
        rr /= shape[red[j]];
      }
      v[static_cast<std::size_t>(r)] = x[static_cast<std::size_t>(at)];
    }
    double acc = 0;
    switch (k) {
      case Reduction::sum:
      case Reduction::mean:
        for (double e : v) acc += e;
        if (k == Reduction::mean) acc /= static_cast<double>(red_n);
        break;
      case Reduction::max:
        acc = *std::max_element(v.begin(), v.end());
        break;
      case Reduction::min:
        acc = *std::min_element(v.begin(), v.end());
        break;
      case Reduction::argmax:  // the first maximum: the smallest index
        acc = static_cast<double>(std::max_element(v.begin(), v.end()) - v.begin());
        break;
      case Reduction::argmin:
        acc = static_cast<double>(std::min_element(v.begin(), v.end()) - v.begin());
        break;
      case Reduction::logsumexp: {
        const double m = *std::max_element(v.begin(), v.end());
        for (double e : v) acc += std::exp(e - m);
        acc = m + std::log(acc);
        break;
      }
      case Reduction::norm:
        for (double e : v) acc += e * e;
        acc = std::sqrt(acc);
        break;
    }
    out[static_cast<std::size_t>(o)] = acc;
  }
  return out;
}

// --- random cases -------------------------------------------------------------------------------

struct Case {
  std::vector<int> sizes;
  std::vector<std::string> names;
  Reduction kind = Reduction::sum;
  bool single = false;
  std::string in_labels;  // memory order
  Shape shape;
  Layout layout;
  std::string labels;  // reduced, in the order given to the op
  std::uint64_t salt = 0;
};

std::string describe(const Case& c, int index) {
  std::ostringstream s;
  s << "case #" << index << ": mesh " << sizes_text(c.sizes) << ", "
    << (c.single ? "float" : "double") << ", " << gshard::detail::reduction_name(c.kind) << "<\""
    << c.labels << "\"> of \"" << layout_text(c.layout, c.names) << "\" shape "
    << list_text(c.shape) << ", salt " << c.salt;
  return s.str();
}

Case random_case(Dice& dice, const std::vector<int>& sizes, const std::vector<std::string>& names,
                 std::uint64_t salt) {
  Case c;
  c.sizes = sizes;
  c.names = names;
  c.salt = salt;
  c.kind = all_kinds[dice.below(8)];
  c.single = dice.chance(25);
  const auto [labels, shape, layout, split, other] =
      gshard::test::random_operand(dice, static_cast<int>(sizes.size()));
  c.in_labels = labels;
  c.shape = shape;
  c.layout = layout;
  const int rank = static_cast<int>(labels.size());
  // Prefer reducing split labels (the interesting case), sometimes several, in random order.
  const std::string order = dice.chance(75) ? split + other : other + split;
  c.labels = order.substr(0, static_cast<std::size_t>(dice.between(1, rank)));
  dice.shuffle(c.labels);
  return c;
}

// Comm of a case by the rules: finishing the input (the reshard plan's bytes) for a non-linear
// reduction, then the AllReduces of the result block over the reduced labels' axes.
struct Expected {
  Int calls = 0;
  Int bytes = 0;
};

template <class T>
Expected expected_comm(const Case& c, const gshard::detail::MeshState& mesh) {
  Expected e;
  if (linear(c.kind)) return e;
  if (c.layout.partial_count > 0) {
    Layout none = c.layout;
    none.partial_count = 0;
    none.partial = {};
    const auto plan = gshard::detail::plan_reshard(c.layout, none, c.shape, mesh.sizes, mesh.coords,
                                                   c.names, Int{sizeof(T)});
    for (const auto& st : plan.steps)  // steps over axes of size 1 are local
      if (st.kind != gshard::StepKind::local &&
          gshard::detail::group_size_of(st.axes, mesh.sizes) > 1)
        ++e.calls;
    e.bytes += plan.bytes();
  }
  Int k = 1, rows = 1;
  for (int d = 0; d < c.layout.rank; ++d) {
    const auto& dim = c.layout.dims[d];
    if (c.labels.find(dim.label) != std::string::npos) {
      for (int i = 0; i < dim.axis_count; ++i) k *= c.sizes[static_cast<std::size_t>(dim.axes[i])];
    } else {
      Int shards = 1;
      for (int i = 0; i < dim.axis_count; ++i)
        shards *= c.sizes[static_cast<std::size_t>(dim.axes[i])];
      rows *= (c.shape[static_cast<std::size_t>(d)] + shards - 1) / shards;
    }
  }
  if (k == 1) return e;
  e.calls += all_reduces(c.kind);
  const Int value = 2 * (k - 1) * rows * Int{sizeof(T)} / k;
  const Int index = 2 * (k - 1) * rows * Int{sizeof(Int)} / k;
  e.bytes += arg(c.kind) ? value + index : all_reduces(c.kind) * value;
  return e;
}

// The result block: padding zero, then (summed over partial copies) each element equal to the
// naive value.
template <class V>
std::string check_values(const std::vector<V>& got, const Layout& l, const Shape& shape,
                         const std::vector<double>& want, const Grid& grid,
                         const gshard::detail::MeshState& mesh, double tol) {
  std::vector<Int> global_of;
  std::vector<double> sum;
  std::string wrong = gshard::test::sum_partial_copies(got, l, shape, grid, mesh, global_of, sum);
  for (std::size_t i = 0; i < sum.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const double w = want[static_cast<std::size_t>(global_of[i])];
    if (!(std::abs(sum[i] - w) <= tol * (1 + std::abs(w)))) {
      std::ostringstream s;
      s.precision(17);
      s << "local element " << i << " (global " << global_of[i] << ") is " << sum[i]
        << ", expected " << w;
      wrong = s.str();
    }
  }
  return wrong;
}

template <class T>
std::string run_case(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid) {
  const std::vector<double> global =
      random_global(gshard::detail::product(c.shape), c.salt, 0, c.single);
  const gshard::detail::RuntimeTensor<T> x{
      c.layout, c.shape,
      device_copy(shard_of<T>(c.layout, c.shape, global, grid, c.salt, c.single)),
      gshard::ReduceOp::sum};
  const Expected expect = expected_comm<T>(c, mesh);
  gshard::comm_counters().reset();
  gshard::detail::Reduced<T> r;
  std::string threw;
  try {
    r = gshard::detail::reduce_runtime<T>(c.kind, c.labels, mesh, c.names, x);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  const gshard::CommCount counted = gshard::comm_counters().total();
  std::string wrong;
  const Layout want_layout = expected_layout(c.layout, c.labels, c.kind);
  if (!(r.value.layout == want_layout))
    wrong = "result layout \"" + layout_text(r.value.layout, c.names) + "\", the rules say \"" +
            layout_text(want_layout, c.names) + "\"";
  Shape want_shape;
  for (std::size_t d = 0; d < c.in_labels.size(); ++d)
    if (c.labels.find(c.in_labels[d]) == std::string::npos) want_shape.push_back(c.shape[d]);
  if (wrong.empty() && r.value.shape != want_shape) wrong = "result shape differs";
  if (wrong.empty() && (counted.calls != expect.calls || counted.bytes != expect.bytes))
    wrong = "communication: " + std::to_string(counted.calls) + " calls, " +
            std::to_string(counted.bytes) + " bytes; expected " + std::to_string(expect.calls) +
            " calls, " + std::to_string(expect.bytes) + " bytes";
  int usable = wrong.empty() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (usable == 0) return wrong.empty() ? "another rank's result is unusable" : wrong;
  const std::vector<double> want = naive(c.kind, c.in_labels, c.shape, global, c.labels);
  const double tol = (c.kind == Reduction::logsumexp || c.kind == Reduction::norm)
                         ? (c.single ? 1e-5 : 1e-12)
                         : (c.single ? 1e-6 : 1e-13);
  if (arg(c.kind))
    return check_values(host_copy(r.index.data), r.index.layout, r.index.shape, want, grid, mesh,
                        0.0);
  return check_values(host_copy(r.value.data), r.value.layout, r.value.shape, want, grid, mesh,
                      tol);
}

constexpr int total_random_cases = 480;

}  // namespace

TEST_CASE(
    "reductions (run-time engine): random kinds, labels, layouts and meshes vs a naive loop") {
  const int n = world_size();
  const gshard::test::TestMeshes test_meshes(n);
  const std::vector<MeshUnderTest>& meshes = test_meshes.all;
  const int per_mesh =
      (total_random_cases + static_cast<int>(meshes.size()) - 1) / static_cast<int>(meshes.size());
  Dice dice(20261202);
  int cases = 0, failures = 0, split_reduced = 0, partial_in = 0, uneven = 0;
  std::map<Reduction, int> per_kind;
  for (const auto& m : meshes) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, m.sizes, m.names, static_cast<std::uint64_t>(cases) + 1);
      ++per_kind[c.kind];
      partial_in += c.layout.partial_count > 0 ? 1 : 0;
      bool split = false, odd = false;
      for (int d = 0; d < c.layout.rank; ++d) {
        int k = 1;
        for (int a = 0; a < c.layout.dims[d].axis_count; ++a)
          k *= m.sizes[static_cast<std::size_t>(c.layout.dims[d].axes[a])];
        if (c.labels.find(c.layout.dims[d].label) != std::string::npos && k > 1) split = true;
        if (c.shape[static_cast<std::size_t>(d)] % k != 0) odd = true;
      }
      split_reduced += split ? 1 : 0;
      uneven += odd ? 1 : 0;
      const std::string wrong =
          c.single ? run_case<float>(c, *m.state, grid) : run_case<double>(c, *m.state, grid);
      if (!wrong.empty() && failures++ < 8)
        FAIL_CHECK(describe(c, cases)
                   << " at " << n << " ranks, rank " << world_rank() << ": " << wrong);
      ++cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(cases << " random reductions over " << meshes.size() << " meshes: " << split_reduced
                  << " over a split label, " << partial_in << " with partial inputs, " << uneven
                  << " uneven");
  CHECK(cases >= 400);
  CHECK(failures == 0);
  for (Reduction k : all_kinds) CHECK(per_kind[k] >= 20);
  if (n > 1) CHECK(split_reduced >= cases / 3);
}

// --- typed API ----------------------------------------------------------------------------------

namespace {

using M = gshard::Mesh<"x", "y">;

template <class S>
S typed_input(const M& mesh, const Grid& grid, const Shape& shape, std::uint64_t salt,
              std::vector<double>& global) {
  global = random_global(gshard::detail::product(shape), salt, 0, false);
  return S(mesh, shape, device_copy(shard_of<double>(S::layout, shape, global, grid, salt, false)));
}

template <class R>
void check_typed(const R& r, const std::vector<double>& want, const std::string& what, double tol) {
  INFO(what);
  const auto got = r.to_global();
  REQUIRE(got.size() == want.size());
  std::string wrong;
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
    if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= tol * (1 + std::abs(want[i]))))
      wrong = "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
              std::to_string(want[i]);
  CHECK(wrong == "");
}

}  // namespace

TEST_CASE("reductions, typed: result specs by the rules, values, exact comm on split labels") {
  const int n = world_size();
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const int ay = n / ax;
    const M mesh(MPI_COMM_WORLD, {ax, ay});
    const Grid grid = grid_of({ax, ay}, world_rank());
    INFO("mesh " << ax << "x" << ay);
    using X = gshard::Sharded<double, M, "G:x S:y M">;
    const Shape shape{5, 7, 3};  // uneven over every axis size but 1
    std::vector<double> g;
    const X x = typed_input<X>(mesh, grid, shape, 77, g);
    auto bytes_ar = [](Int k, Int elems, Int size) { return 2 * (k - 1) * elems * size / k; };
    const Int rows_gm = ((5 + ax - 1) / ax) * 3;  // the result block of "G:x M"

    // sum over a split label: partial over its axis, no communication.
    gshard::comm_counters().reset();
    const auto s = gshard::sum<"S">(x);
    static_assert(std::string_view(decltype(s)::spec.view()) == "G:x M +y");
    CHECK(gshard::comm_counters().total().calls == 0);
    check_typed(s, naive(Reduction::sum, "GSM", shape, g, "S"), "sum<S>", 1e-13);
    // The same type as the unary einsum that sums S away.
    static_assert(std::is_same_v<std::remove_const_t<decltype(s)>,
                                 typename decltype(gshard::einsum<"GSM->GM">(x))::result_type>);
    // mean over two labels, one replicated: partial over y only.
    const auto mn = gshard::mean<"MS">(x);
    static_assert(std::string_view(decltype(mn)::spec.view()) == "G:x +y");
    check_typed(mn, naive(Reduction::mean, "GSM", shape, g, "MS"), "mean<MS>", 1e-13);
    // Pending sums of the input stay pending through sum.
    gshard::comm_counters().reset();
    const auto s2 = gshard::sum<"M">(s);
    static_assert(std::string_view(decltype(s2)::spec.view()) == "G:x +y");
    CHECK(gshard::comm_counters().total().calls == 0);
    check_typed(s2, naive(Reduction::sum, "GSM", shape, g, "SM"), "sum<M>(sum<S>)", 1e-13);

    // max over the split label: one AllReduce (max) of the result block over y.
    gshard::comm_counters().reset();
    const auto mx = gshard::max<"S">(x);
    static_assert(std::string_view(decltype(mx)::spec.view()) == "G:x M");
    const auto ar_y = gshard::comm_counters().get("y", gshard::Collective::all_reduce);
    CHECK(ar_y.calls == (ay > 1 ? 1 : 0));
    CHECK(ar_y.bytes == bytes_ar(ay, rows_gm, 8));
    CHECK(gshard::comm_counters().total().calls == ar_y.calls);
    check_typed(mx, naive(Reduction::max, "GSM", shape, g, "S"), "max<S>", 0);

    // argmax: AllReduce max of the values, then AllReduce min of the int64 candidates.
    gshard::comm_counters().reset();
    const auto am = gshard::argmax<"S">(x);
    static_assert(std::is_same_v<typename decltype(am)::value_type, std::int64_t>);
    const auto ar_am = gshard::comm_counters().get("y", gshard::Collective::all_reduce);
    CHECK(ar_am.calls == (ay > 1 ? 2 : 0));
    CHECK(ar_am.bytes == 2 * bytes_ar(ay, rows_gm, 8));
    check_typed(am, naive(Reduction::argmax, "GSM", shape, g, "S"), "argmax<S>", 0);

    // logsumexp over both split labels: two AllReduces over x*y of the "M" block.
    gshard::comm_counters().reset();
    const auto lse = gshard::logsumexp<"GS">(x);
    static_assert(std::string_view(decltype(lse)::spec.view()) == "M");
    const auto ar_xy = gshard::comm_counters().get("x*y", gshard::Collective::all_reduce);
    CHECK(ar_xy.calls == (n > 1 ? 2 : 0));
    CHECK(ar_xy.bytes == 2 * bytes_ar(n, 3, 8));
    CHECK(gshard::comm_counters().total().calls == ar_xy.calls);
    check_typed(lse, naive(Reduction::logsumexp, "GSM", shape, g, "GS"), "logsumexp<GS>", 1e-12);

    // norm: one AllReduce (sum of squares).
    gshard::comm_counters().reset();
    const auto nr = gshard::norm<"G">(x);
    static_assert(std::string_view(decltype(nr)::spec.view()) == "S:y M");
    const auto ar_x = gshard::comm_counters().get("x", gshard::Collective::all_reduce);
    CHECK(ar_x.calls == (ax > 1 ? 1 : 0));
    CHECK(ar_x.bytes == bytes_ar(ax, ((7 + ay - 1) / ay) * 3, 8));
    check_typed(nr, naive(Reduction::norm, "GSM", shape, g, "G"), "norm<G>", 1e-12);

    // min of a partial input (the result of sum<"S">): finished first (one AllReduce over y of
    // the "G:x M" block), then reduced over the unsplit M: nothing more.
    gshard::comm_counters().reset();
    const auto mi = gshard::min<"M">(s);
    static_assert(std::string_view(decltype(mi)::spec.view()) == "G:x");
    const auto fin = gshard::comm_counters().get("y", gshard::Collective::all_reduce);
    CHECK(fin.calls == (ay > 1 ? 1 : 0));
    CHECK(fin.bytes == bytes_ar(ay, rows_gm, 8));
    CHECK(gshard::comm_counters().total().calls == fin.calls);
    {
      const auto sum_s = naive(Reduction::sum, "GSM", shape, g, "S");  // "G M"
      check_typed(mi, naive(Reduction::min, "GM", {5, 3}, sum_s, "M"), "min<M>(sum<S>)", 1e-13);
    }

    // argmin over two labels: the flat index is row-major in the order written ("MS").
    const auto ai = gshard::argmin<"MS">(x);
    check_typed(ai, naive(Reduction::argmin, "GSM", shape, g, "MS"), "argmin<MS>", 0);

    // Over every label: a scalar, partial for sum, finished for max.
    const auto all = gshard::sum<"MGS">(x);
    static_assert(std::string_view(decltype(all)::spec.view()) == "+x +y");
    check_typed(all, naive(Reduction::sum, "GSM", shape, g, "MGS"), "sum<MGS>", 1e-13);
    const auto top = gshard::max<"SGM">(x);
    static_assert(std::string_view(decltype(top)::spec.view()).empty());
    check_typed(top, naive(Reduction::max, "GSM", shape, g, "SGM"), "max<SGM>", 0);

    // A lazy input: reduced straight from an elementwise expression.
    const auto mx2 = gshard::max<"SM">(x * 2.0);
    std::vector<double> g2(g);
    for (double& v : g2) v *= 2;
    check_typed(mx2, naive(Reduction::max, "GSM", shape, g2, "SM"), "max<SM>(x * 2)", 0);

    // Integer elements: sum and argmax.
    using XI = gshard::Sharded<std::int64_t, M, "G S:y">;
    std::vector<double> gi(35);
    for (std::size_t i = 0; i < gi.size(); ++i) gi[i] = static_cast<double>((i * 7) % 11);
    std::vector<std::int64_t> gi64(gi.begin(), gi.end());
    const XI xi = gshard::from_global<XI>(mesh, {5, 7}, gi64);
    check_typed(gshard::sum<"S">(xi), naive(Reduction::sum, "GS", {5, 7}, gi, "S"), "int sum", 0);
    check_typed(gshard::argmax<"S">(xi), naive(Reduction::argmax, "GS", {5, 7}, gi, "S"),
                "int argmax", 0);
  }
}

TEST_CASE("reductions: pending max partials are finished by max, refused by sum") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  using P = gshard::Sharded<double, M, "I J +y">;
  std::vector<double> g = random_global(12, 5, 0, false);
  // Every copy holds the value: a valid max partial.
  P p = gshard::from_global<P>(mesh, {3, 4}, g);
  const Grid grid = grid_of({1, n}, world_rank());
  Layout whole = P::layout;
  whole.partial_count = 0;
  whole.partial = {};
  p = P(mesh, {3, 4}, device_copy(shard_of<double>(whole, {3, 4}, g, grid, 0, false)));
  gshard::detail::set_partial_op(p, gshard::ReduceOp::max);
  check_typed(gshard::max<"J">(p), naive(Reduction::max, "IJ", {3, 4}, g, "J"), "max of max", 0);
  int threw = 0;
  std::string message;
  try {
    (void)gshard::sum<"J">(p);
  } catch (const gshard::Error& e) {
    threw = 1;
    message = e.what();
  }
  CHECK(threw == 1);
  CHECK(message.find("max/min partials") != std::string::npos);
}

TEST_CASE("reductions: run-time mistakes throw gshard::Error naming op, labels, layout, shape") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  using X = gshard::Sharded<double, M, "I J:y">;
  const X x = gshard::full<X>(mesh, {3, 0}, 1.0);
  const auto rt = gshard::detail::runtime_tensor(x);
  const auto names = gshard::detail::axis_name_list<M>();
  auto message_of = [&](Reduction k, const std::string& labels) {
    std::string m;
    int threw = 0;
    try {
      (void)gshard::detail::reduce_runtime<double>(k, labels, gshard::detail::mesh_state(mesh),
                                                   names, rt);
    } catch (const gshard::Error& e) {
      m = e.what();
      threw = 1;
    }
    int all = threw;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all == threw * n);  // every rank or none
    return m;
  };
  std::string m = message_of(Reduction::max, "J");
  CHECK(m.find("max") != std::string::npos);
  CHECK(m.find("'J' has size 0") != std::string::npos);
  CHECK(m.find("over \"J\"") != std::string::npos);
  CHECK(m.find("I J:y") != std::string::npos);
  CHECK(m.find("[3, 0]") != std::string::npos);
  m = message_of(Reduction::sum, "K");
  CHECK(m.find("label 'K' is not a label") != std::string::npos);
  m = message_of(Reduction::norm, "II");
  CHECK(m.find("appears twice") != std::string::npos);
  m = message_of(Reduction::mean, "");
  CHECK(m.find("no labels") != std::string::npos);
  // sum over an empty label is 0, not an error.
  CHECK(message_of(Reduction::sum, "J").empty());
}
