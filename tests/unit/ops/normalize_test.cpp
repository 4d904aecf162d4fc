// Normalizations (ops/normalize.hpp): random softmax, log_softmax, layer_norm and rms_norm cases
// (with and without gain and bias of their own random layouts) through the run-time engine
// (gshard::detail::normalize_runtime) against a naive single-rank loop, on every listed mesh
// shape, the label split or replicated, inputs partial, sizes uneven; the communication of every
// case against the count the rules promise; then exact comm counts of the typed API on a split
// label, typed cases with gain and bias, and errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"
// Included after mpi_test.hpp, as every op header.
#include <gshard/ops/normalize.hpp>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

using gshard::Layout;
using gshard::Shape;
using gshard::detail::Normalization;
using gshard::test::device_copy;
using gshard::test::Dice;
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

constexpr Normalization all_kinds[] = {Normalization::softmax, Normalization::log_softmax,
                                       Normalization::layer_norm, Normalization::rms_norm};

// AllReduces of the row statistics over a split label.
int all_reduces(Normalization k) { return k == Normalization::rms_norm ? 1 : 2; }

// --- the naive reference ------------------------------------------------------------------------

std::vector<double> naive(Normalization k, const std::string& labels, const Shape& shape,
                          const std::vector<double>& x, char label, double eps,
                          const std::vector<double>* gain, const std::vector<double>* bias) {
  const std::size_t ld = labels.find(label);
  Int inner = 1;
  for (std::size_t d = ld + 1; d < labels.size(); ++d) inner *= shape[d];
  const Int n = shape[ld];
  const Int outer = gshard::detail::product(shape) / std::max<Int>(1, n * inner);
  std::vector<double> y(x.size());
  for (Int o = 0; o < outer; ++o)
    for (Int i = 0; i < inner; ++i) {
      auto at = [&](Int l) { return static_cast<std::size_t>((o * n + l) * inner + i); };
      double a = 0, b = 0;
      if (k == Normalization::softmax || k == Normalization::log_softmax) {
        a = -INFINITY;
        for (Int l = 0; l < n; ++l) a = std::max(a, x[at(l)]);
        for (Int l = 0; l < n; ++l) b += std::exp(x[at(l)] - a);
      } else if (k == Normalization::layer_norm) {
        for (Int l = 0; l < n; ++l) a += x[at(l)];
        a /= static_cast<double>(n);
        for (Int l = 0; l < n; ++l) b += (x[at(l)] - a) * (x[at(l)] - a);
        b /= static_cast<double>(n);
      } else {
        for (Int l = 0; l < n; ++l) a += x[at(l)] * x[at(l)];
        a /= static_cast<double>(n);
      }
      for (Int l = 0; l < n; ++l) {
        const double v = x[at(l)];
        double r = 0;
        switch (k) {
          case Normalization::softmax:
            r = std::exp(v - a) / b;
            break;
          case Normalization::log_softmax:
            r = v - a - std::log(b);
            break;
          case Normalization::layer_norm:
            r = (v - a) / std::sqrt(b + eps);
            break;
          case Normalization::rms_norm:
            r = v / std::sqrt(a + eps);
            break;
        }
        if (gain != nullptr) r *= (*gain)[static_cast<std::size_t>(l)];
        if (bias != nullptr) r += (*bias)[static_cast<std::size_t>(l)];
        y[at(l)] = r;
      }
    }
  return y;
}

// --- random cases -------------------------------------------------------------------------------

struct Param {
  bool present = false;
  Layout layout;
};

struct Case {
  std::vector<int> sizes;
  std::vector<std::string> names;
  Normalization kind = Normalization::softmax;
  bool single = false;
  std::string labels;  // memory order
  Shape shape;
  Layout layout;
  char label = 'A';
  Param gain, bias;
  std::uint64_t salt = 0;
};

std::string describe(const Case& c, int index) {
  std::ostringstream s;
  s << "case #" << index << ": mesh " << sizes_text(c.sizes) << ", "
    << (c.single ? "float" : "double") << ", " << gshard::detail::normalization_name(c.kind)
    << "<\"" << c.label << "\"> of \"" << layout_text(c.layout, c.names) << "\" shape "
    << list_text(c.shape);
  if (c.gain.present) s << ", gain \"" << layout_text(c.gain.layout, c.names) << "\"";
  if (c.bias.present) s << ", bias \"" << layout_text(c.bias.layout, c.names) << "\"";
  s << ", salt " << c.salt;
  return s.str();
}

Case random_case(Dice& dice, const std::vector<int>& sizes, const std::vector<std::string>& names,
                 std::uint64_t salt) {
  Case c;
  c.sizes = sizes;
  c.names = names;
  c.salt = salt;
  c.kind = all_kinds[dice.below(4)];
  c.single = dice.chance(25);
  const auto [labels, shape, layout, split, other] =
      gshard::test::random_operand(dice, static_cast<int>(sizes.size()));
  c.labels = labels;
  c.shape = shape;
  c.layout = layout;
  c.label = (dice.chance(75) && !split.empty()) || other.empty() ? split[0] : other[0];
  const int axis_count = static_cast<int>(sizes.size());
  if (c.kind == Normalization::layer_norm || c.kind == Normalization::rms_norm) {
    c.gain.present = dice.chance(60);
    c.bias.present = c.gain.present && c.kind == Normalization::layer_norm && dice.chance(60);
    std::map<char, std::vector<int>> fixed;
    if (dice.chance(50)) {  // often already in the input's split of the label: read in place
      const int d = c.layout.find(c.label);
      for (int i = 0; i < c.layout.dims[d].axis_count; ++i)
        fixed[c.label].push_back(c.layout.dims[d].axes[i]);
    }
    if (c.gain.present)
      c.gain.layout = random_layout(dice, std::string(1, c.label), axis_count, fixed);
    if (c.bias.present)
      c.bias.layout = random_layout(dice, std::string(1, c.label), axis_count, fixed);
  }
  return c;
}

struct Expected {
  Int calls = 0;
  Int bytes = 0;
};

void add_plan(Expected& e, const Layout& from, const Layout& to, const Shape& shape,
              const gshard::detail::MeshState& mesh, const std::vector<std::string>& names,
              Int elem) {
  const auto plan =
      gshard::detail::plan_reshard(from, to, shape, mesh.sizes, mesh.coords, names, elem);
  for (const auto& st : plan.steps)  // steps over axes of size 1 are local
    if (st.kind != gshard::StepKind::local &&
        gshard::detail::group_size_of(st.axes, mesh.sizes) > 1)
      ++e.calls;
  e.bytes += plan.bytes();
}

// Finishing the input, bringing gain and bias to the input's split of the label, then the
// AllReduces of the row statistics over the label's axes.
template <class T>
Expected expected_comm(const Case& c, const gshard::detail::MeshState& mesh) {
  Expected e;
  Layout x = c.layout;
  x.partial_count = 0;
  x.partial = {};
  add_plan(e, c.layout, x, c.shape, mesh, c.names, Int{sizeof(T)});
  Layout need{};
  need.rank = 1;
  need.dims[0] = x.dims[x.find(c.label)];
  const Shape n{c.shape[static_cast<std::size_t>(x.find(c.label))]};
  if (c.gain.present) add_plan(e, c.gain.layout, need, n, mesh, c.names, Int{sizeof(T)});
  if (c.bias.present) add_plan(e, c.bias.layout, need, n, mesh, c.names, Int{sizeof(T)});
  Int k = 1, rows = 1;
  for (int d = 0; d < x.rank; ++d) {
    Int shards = 1;
    for (int i = 0; i < x.dims[d].axis_count; ++i)
      shards *= c.sizes[static_cast<std::size_t>(x.dims[d].axes[i])];
    if (x.dims[d].label == c.label)
      k = shards;
    else
      rows *= (c.shape[static_cast<std::size_t>(d)] + shards - 1) / shards;
  }
  if (k > 1) {
    e.calls += all_reduces(c.kind);
    e.bytes += all_reduces(c.kind) * (2 * (k - 1) * rows * Int{sizeof(T)} / k);
  }
  return e;
}

template <class T>
std::string check_values(const std::vector<T>& got, const Layout& l, const Shape& shape,
                         const std::vector<double>& want, const Grid& grid, double tol) {
  std::vector<Int> global_of;
  const Int total = for_block(l, shape, grid, [&](Int, Int g) { global_of.push_back(g); });
  if (static_cast<Int>(got.size()) != total)
    return "local size " + std::to_string(got.size()) + ", expected " + std::to_string(total);
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (global_of[i] < 0) {
      if (got[i] != T{})
        return "padding element " + std::to_string(i) + " holds " + std::to_string(got[i]);
      continue;
    }
    const double w = want[static_cast<std::size_t>(global_of[i])];
    if (!(std::abs(static_cast<double>(got[i]) - w) <= tol * (1 + std::abs(w)))) {
      std::ostringstream s;
      s.precision(17);
      s << "local element " << i << " (global " << global_of[i] << ") is " << got[i]
        << ", expected " << w;
      return s.str();
    }
  }
  return "";
}

template <class T>
std::string run_case(const Case& c, const gshard::detail::MeshState& mesh, const Grid& grid) {
  using RT = gshard::detail::RuntimeTensor<T>;
  const std::vector<double> global =
      random_global(gshard::detail::product(c.shape), c.salt, 0, c.single);
  const RT x{c.layout, c.shape,
             device_copy(shard_of<T>(c.layout, c.shape, global, grid, c.salt, c.single)),
             gshard::ReduceOp::sum};
  const Shape n{c.shape[static_cast<std::size_t>(c.layout.find(c.label))]};
  const std::vector<double> gg = random_global(n[0], c.salt, 1, c.single);
  const std::vector<double> gb = random_global(n[0], c.salt, 2, c.single);
  RT gain, bias;
  if (c.gain.present)
    gain = RT{c.gain.layout, n,
              device_copy(shard_of<T>(c.gain.layout, n, gg, grid, c.salt ^ 0x77, c.single)),
              gshard::ReduceOp::sum};
  if (c.bias.present)
    bias = RT{c.bias.layout, n,
              device_copy(shard_of<T>(c.bias.layout, n, gb, grid, c.salt ^ 0x99, c.single)),
              gshard::ReduceOp::sum};
  const Expected expect = expected_comm<T>(c, mesh);
  const double eps = 1e-5;
  gshard::comm_counters().reset();
  RT r;
  std::string threw;
  try {
    r = gshard::detail::normalize_runtime<T>(c.kind, c.label, mesh, c.names, x, eps,
                                             c.gain.present ? &gain : nullptr,
                                             c.bias.present ? &bias : nullptr);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gshard::test::threw_anywhere(threw); !thrown.empty())
    return thrown;
  const gshard::CommCount counted = gshard::comm_counters().total();
  Layout want_layout = c.layout;
  want_layout.partial_count = 0;
  want_layout.partial = {};
  if (!(r.layout == want_layout))
    return "result layout \"" + layout_text(r.layout, c.names) + "\", expected \"" +
           layout_text(want_layout, c.names) + "\"";
  if (r.shape != c.shape) return "result shape differs";
  if (counted.calls != expect.calls || counted.bytes != expect.bytes)
    return "communication: " + std::to_string(counted.calls) + " calls, " +
           std::to_string(counted.bytes) + " bytes; expected " + std::to_string(expect.calls) +
           " calls, " + std::to_string(expect.bytes) + " bytes";
  const std::vector<double> want =
      naive(c.kind, c.labels, c.shape, global, c.label, eps, c.gain.present ? &gg : nullptr,
            c.bias.present ? &gb : nullptr);
  return check_values(host_copy(r.data), r.layout, r.shape, want, grid, c.single ? 1e-4 : 1e-10);
}

constexpr int total_random_cases = 400;

}  // namespace

TEST_CASE("normalizations (run-time engine): random kinds, layouts, gains and meshes vs naive") {
  const int n = world_size();
  const gshard::test::TestMeshes test_meshes(n);
  const std::vector<MeshUnderTest>& meshes = test_meshes.all;
  const int per_mesh =
      (total_random_cases + static_cast<int>(meshes.size()) - 1) / static_cast<int>(meshes.size());
  Dice dice(20261203);
  int cases = 0, failures = 0, split_label = 0, partial_in = 0, with_gain = 0, uneven = 0;
  std::map<Normalization, int> per_kind;
  for (const auto& m : meshes) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, m.sizes, m.names, static_cast<std::uint64_t>(cases) + 1);
      ++per_kind[c.kind];
      partial_in += c.layout.partial_count > 0 ? 1 : 0;
      with_gain += c.gain.present ? 1 : 0;
      const auto& dim = c.layout.dims[c.layout.find(c.label)];
      int k = 1;
      for (int a = 0; a < dim.axis_count; ++a) k *= m.sizes[static_cast<std::size_t>(dim.axes[a])];
      split_label += k > 1 ? 1 : 0;
      uneven += c.shape[static_cast<std::size_t>(c.layout.find(c.label))] % k != 0 ? 1 : 0;
      const std::string wrong =
          c.single ? run_case<float>(c, *m.state, grid) : run_case<double>(c, *m.state, grid);
      int bad = wrong.empty() ? 0 : 1;
      MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
      if (bad != 0 && failures++ < 8)
        FAIL_CHECK(describe(c, cases) << " at " << n << " ranks, rank " << world_rank() << ": "
                                      << (wrong.empty() ? "fine here, wrong elsewhere" : wrong));
      ++cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(cases << " random normalizations over " << meshes.size() << " meshes: " << split_label
                  << " over a split label (" << uneven << " of them uneven), " << partial_in
                  << " with partial inputs, " << with_gain << " with a gain");
  CHECK(cases >= 400);
  CHECK(failures == 0);
  for (Normalization k : all_kinds) CHECK(per_kind[k] >= 50);
  if (n > 1) CHECK(split_label >= cases / 3);
}

// --- typed API ----------------------------------------------------------------------------------

namespace {

using M = gshard::Mesh<"x", "y">;

template <class R>
void check_typed(const R& r, const std::vector<double>& want, const std::string& what, double tol) {
  INFO(what);
  const auto got = r.to_global();
  REQUIRE(got.size() == want.size());
  std::string wrong;
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i]))))
      wrong = "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
              std::to_string(want[i]);
  CHECK(wrong == "");
}

}  // namespace

TEST_CASE("normalizations, typed: specs, values, exact AllReduces over a split label") {
  const int n = world_size();
  for (int ax = 1; ax <= n; ++ax) {
    if (n % ax != 0) continue;
    const int ay = n / ax;
    const M mesh(MPI_COMM_WORLD, {ax, ay});
    INFO("mesh " << ax << "x" << ay);
    using X = gshard::Sharded<double, M, "B:x S:y">;
    const Shape shape{3, 11};  // S uneven over y = 2, 4, 8
    const std::vector<double> g = random_global(33, 9, 0, false);
    const X x = gshard::from_global<X>(mesh, shape, g);
    const Int rows = (3 + ax - 1) / ax;  // the statistics block: "B:x"
    const Int ar_bytes = 2 * (ay - 1) * rows * 8 / ay;

    // softmax over the split S: exactly two AllReduces over y of the reduced size (max, sum).
    gshard::comm_counters().reset();
    const auto sm = gshard::softmax<"S">(x);
    static_assert(std::is_same_v<std::remove_const_t<decltype(sm)>, X>);
    {
      const auto c = gshard::comm_counters().get("y", gshard::Collective::all_reduce);
      CHECK(c.calls == (ay > 1 ? 2 : 0));
      CHECK(c.bytes == 2 * ar_bytes);
      CHECK(gshard::comm_counters().total().calls == c.calls);
    }
    check_typed(sm, naive(Normalization::softmax, "BS", shape, g, 'S', 0, nullptr, nullptr),
                "softmax<S>", 1e-12);
    check_typed(gshard::log_softmax<"S">(x),
                naive(Normalization::log_softmax, "BS", shape, g, 'S', 0, nullptr, nullptr),
                "log_softmax<S>", 1e-12);

    // layer_norm with gain and bias: two AllReduces (sum, squared deviations); the gain is
    // replicated (sliced in place), the bias split like S (read in place): nothing else moves.
    using G = gshard::Sharded<double, M, "S">;
    using Bi = gshard::Sharded<double, M, "S:y">;
    const std::vector<double> gg = random_global(11, 9, 1, false);
    const std::vector<double> gb = random_global(11, 9, 2, false);
    const G gain = gshard::from_global<G>(mesh, {11}, gg);
    const Bi bias = gshard::from_global<Bi>(mesh, {11}, gb);
    gshard::comm_counters().reset();
    const auto ln = gshard::layer_norm<"S">(x, gain, bias, 1e-3);
    {
      const auto c = gshard::comm_counters().get("y", gshard::Collective::all_reduce);
      CHECK(c.calls == (ay > 1 ? 2 : 0));
      CHECK(c.bytes == 2 * ar_bytes);
      CHECK(gshard::comm_counters().total().calls == c.calls);
    }
    check_typed(ln, naive(Normalization::layer_norm, "BS", shape, g, 'S', 1e-3, &gg, &gb),
                "layer_norm<S>(x, gain, bias)", 1e-10);
    check_typed(gshard::layer_norm<"S">(x),
                naive(Normalization::layer_norm, "BS", shape, g, 'S', 1e-5, nullptr, nullptr),
                "layer_norm<S>(x)", 1e-10);
    check_typed(gshard::layer_norm<"S">(x, bias, 1e-2),
                naive(Normalization::layer_norm, "BS", shape, g, 'S', 1e-2, &gb, nullptr),
                "layer_norm<S>(x, gain)", 1e-10);

    // rms_norm: one AllReduce (sum of squares).
    gshard::comm_counters().reset();
    const auto rn = gshard::rms_norm<"S">(x, gain);
    {
      const auto c = gshard::comm_counters().get("y", gshard::Collective::all_reduce);
      CHECK(c.calls == (ay > 1 ? 1 : 0));
      CHECK(c.bytes == ar_bytes);
      CHECK(gshard::comm_counters().total().calls == c.calls);
    }
    check_typed(rn, naive(Normalization::rms_norm, "BS", shape, g, 'S', 1e-6, &gg, nullptr),
                "rms_norm<S>(x, gain)", 1e-10);

    // Over the label split on x: softmax of B (reduced block "S:y").
    gshard::comm_counters().reset();
    const auto sb = gshard::softmax<"B">(x);
    {
      const auto c = gshard::comm_counters().get("x", gshard::Collective::all_reduce);
      CHECK(c.calls == (ax > 1 ? 2 : 0));
      CHECK(c.bytes == 2 * (2 * (ax - 1) * ((11 + ay - 1) / ay) * 8 / ax));
    }
    check_typed(sb, naive(Normalization::softmax, "BS", shape, g, 'B', 0, nullptr, nullptr),
                "softmax<B>", 1e-12);

    // A partial input (an einsum result) is finished first: its layout without the partial.
    using W = gshard::Sharded<double, M, "S:y K">;
    const std::vector<double> gw = random_global(11 * 4, 9, 3, false);
    const W w = gshard::from_global<W>(mesh, {11, 4}, gw);
    const auto h = gshard::einsum<"BS,SK->BK">(x, w);
    static_assert(std::string_view(decltype(h)::spec.view()) == "B:x K +y");
    const auto sk = gshard::softmax<"K">(h);
    static_assert(std::string_view(decltype(sk)::spec.view()) == "B:x K");
    std::vector<double> gh(12, 0.0);
    for (int b = 0; b < 3; ++b)
      for (int k = 0; k < 4; ++k)
        for (int s = 0; s < 11; ++s)
          gh[static_cast<std::size_t>(b * 4 + k)] +=
              g[static_cast<std::size_t>(b * 11 + s)] * gw[static_cast<std::size_t>(s * 4 + k)];
    check_typed(sk, naive(Normalization::softmax, "BK", {3, 4}, gh, 'K', 0, nullptr, nullptr),
                "softmax<K>(einsum partial over y)", 1e-12);
  }
}

TEST_CASE("normalizations: run-time mistakes throw gshard::Error on every rank") {
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {1, n});
  using X = gshard::Sharded<double, M, "I J:y">;
  const X x = gshard::full<X>(mesh, {3, 4}, 1.0);
  using G = gshard::Sharded<double, M, "J">;
  const G wrong_size = gshard::full<G>(mesh, {5}, 1.0);
  const auto names = gshard::detail::axis_name_list<M>();
  const auto rx = gshard::detail::runtime_tensor(x);
  const auto rg = gshard::detail::runtime_tensor(wrong_size);
  auto message_of = [&](char label, const gshard::detail::RuntimeTensor<double>* gain) {
    std::string m;
    int threw = 0;
    try {
      (void)gshard::detail::normalize_runtime<double>(Normalization::layer_norm, label,
                                                      gshard::detail::mesh_state(mesh), names, rx,
                                                      1e-5, gain, nullptr);
    } catch (const gshard::Error& e) {
      m = e.what();
      threw = 1;
    }
    int all = threw;
    MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all == threw * n);
    return m;
  };
  std::string m = message_of('K', nullptr);
  CHECK(m.find("layer_norm") != std::string::npos);
  CHECK(m.find("label 'K' is not a label") != std::string::npos);
  CHECK(m.find("I J:y") != std::string::npos);
  m = message_of('J', &rg);
  CHECK(m.find("gain") != std::string::npos);
  CHECK(m.find("of size 4") != std::string::npos);
  CHECK(m.find("[5]") != std::string::npos);
  // The typed API checks the same at run time.
  int threw = 0;
  try {
    (void)gshard::rms_norm<"J">(x, wrong_size);
  } catch (const gshard::Error&) {
    threw = 1;
  }
  CHECK(threw == 1);
}
