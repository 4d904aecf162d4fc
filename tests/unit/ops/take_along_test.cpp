// Batched index ops (ops/index.hpp): take_along<"S"> and scatter_add_along<"S", "Batch"> through
// the typed API on every listed mesh shape, against naive loops over the global arrays: batch
// labels split over x, over x*y (and a 3-axis mesh), replicated; layouts that need a reshard
// first (S split, batch labels split differently, index labels the table lacks split); a pending
// partial table; negative indices ("no element"); int32 and int64 indices; float and double;
// uneven sizes with the result's padding checked zero. Then the communication of the MoE fast
// path (none with Bounds::trusted, the bounds check alone with Bounds::checked) and errors.
//
// Values are small dyadic numbers, so every sum here is exact and results are compared exactly.
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "mpi_test.hpp"
// The header under test, after mpi_test.hpp.
#include <gshard/ops/index.hpp>

#include "grad_checks.hpp"
#include "op_checks.hpp"

namespace {

namespace gs = gshard;
using gs::Shape;
using gshard::test::on_every_mesh;
using gshard::test::world_size;
using Int = std::int64_t;

Int product(const Shape& s) {
  Int p = 1;
  for (Int v : s) p *= v;
  return p;
}

// Calls f(per-label coordinates) for every element of `labels`/`shape`, row-major.
template <class F>
void for_each_global(const std::string& labels, const Shape& shape, F&& f) {
  std::map<char, Int> at;
  for (Int g = 0; g < product(shape); ++g) {
    Int rest = g;
    for (std::size_t d = labels.size(); d-- > 0;) {
      at[labels[d]] = rest % shape[d];
      rest /= shape[d];
    }
    f(at);
  }
}

// The row-major offset of `at` in `labels`/`shape`.
Int offset_of(const std::string& labels, const Shape& shape, std::map<char, Int>& at) {
  Int o = 0;
  for (std::size_t d = 0; d < labels.size(); ++d) o = o * shape[d] + at[labels[d]];
  return o;
}

// Dyadic values in [-2, 2).
std::vector<double> values_of(Int n, unsigned salt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>((i * 7 + salt) % 16) / 4 - 2;
  return v;
}

// Indices in [-1, n): about one in n + 1 is -1 ("no element").
std::vector<Int> indices_of(Int count, Int n, unsigned salt) {
  std::vector<Int> v(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<Int>((i * 5 + salt) % static_cast<std::size_t>(n + 1)) - 1;
  return v;
}

struct Global {
  std::string labels;
  Shape shape;
  std::vector<double> values;
};

// take_along by the definition: result labels are the indices', then the table's others.
Global naive_take_along(const Global& table, const std::string& il, const Shape& ishape,
                        const std::vector<Int>& idx, char s) {
  Global out{il, ishape, {}};
  for (std::size_t d = 0; d < table.labels.size(); ++d)
    if (table.labels[d] != s && il.find(table.labels[d]) == std::string::npos) {
      out.labels += table.labels[d];
      out.shape.push_back(table.shape[d]);
    }
  for_each_global(out.labels, out.shape, [&](std::map<char, Int>& at) {
    const Int v = idx[static_cast<std::size_t>(offset_of(il, ishape, at))];
    double x = 0;
    if (v >= 0) {
      at[s] = v;
      x = table.values[static_cast<std::size_t>(offset_of(table.labels, table.shape, at))];
    }
    out.values.push_back(x);
  });
  return out;
}

// scatter_add_along by the definition: batch labels (values' order), s, the values' others.
Global naive_scatter_along(const Global& values, const std::string& il, const Shape& ishape,
                           const std::vector<Int>& idx, char s, Int n, const std::string& batch) {
  Global out;
  for (std::size_t d = 0; d < values.labels.size(); ++d)
    if (batch.find(values.labels[d]) != std::string::npos) {
      out.labels += values.labels[d];
      out.shape.push_back(values.shape[d]);
    }
  out.labels += s;
  out.shape.push_back(n);
  for (std::size_t d = 0; d < values.labels.size(); ++d)
    if (il.find(values.labels[d]) == std::string::npos) {
      out.labels += values.labels[d];
      out.shape.push_back(values.shape[d]);
    }
  out.values.assign(static_cast<std::size_t>(product(out.shape)), 0.0);
  std::size_t e = 0;
  for_each_global(values.labels, values.shape, [&](std::map<char, Int>& at) {
    const double x = values.values[e++];
    const Int v = idx[static_cast<std::size_t>(offset_of(il, ishape, at))];
    if (v < 0) return;
    at[s] = v;
    out.values[static_cast<std::size_t>(offset_of(out.labels, out.shape, at))] += x;
  });
  return out;
}

template <class R>
std::string labels_of() {
  std::string s;
  for (int d = 0; d < R::layout.rank; ++d) s += R::layout.dims[d].label;
  return s;
}

template <class S>
S make_from(const typename S::mesh_type& mesh, const Shape& shape, const std::vector<double>& v) {
  using T = typename S::value_type;
  return gs::from_global<S>(mesh, shape, std::vector<T>(v.begin(), v.end()));
}

template <class S>
S ids_from(const typename S::mesh_type& mesh, const Shape& shape, const std::vector<Int>& v) {
  using I = typename S::value_type;
  return gs::from_global<S>(mesh, shape, std::vector<I>(v.begin(), v.end()));
}

// Every padding element of this rank's block is zero.
template <class R>
bool padding_zero(const R& r) {
  auto b = gs::detail::block_index(R::layout, r.shape(), r.mesh().sizes(), r.mesh().coordinates());
  b.holds_values = true;  // every partial copy keeps its padding zero too
  auto host = Kokkos::create_mirror_view(r.local_view());
  Kokkos::deep_copy(host, r.local_view());
  bool ok = true;
  for (Int i = 0; i < static_cast<Int>(host.extent(0)); ++i)
    if (b.global_of(i) < 0) ok = ok && host(i) == typename R::value_type{};
  return ok;
}

// The result against the reference: labels, shape, values (summed over partial copies by
// to_global), padding zero.
template <class R>
void check_result(const R& r, const Global& want) {
  CHECK(labels_of<R>() == want.labels);
  CHECK(r.shape() == want.shape);
  const auto got = r.to_global();
  CHECK(std::vector<double>(got.begin(), got.end()) == want.values);
  CHECK(padding_zero(r));
}

// take_along<"S"> of a table of type Tab (labels tl) at indices of type Ids (labels il).
template <class Tab, class Ids, class Mesh>
void take_case(const Mesh& mesh, const std::string& tl, const Shape& tshape, const std::string& il,
               const Shape& ishape, unsigned salt) {
  const Global table{tl, tshape, values_of(product(tshape), salt)};
  const Int n = tshape[tl.find('S')];
  const std::vector<Int> idx = indices_of(product(ishape), n, salt);
  const auto t = make_from<Tab>(mesh, tshape, table.values);
  const auto i = ids_from<Ids>(mesh, ishape, idx);
  const auto r = gs::take_along<"S">(t, i);
  check_result(r, naive_take_along(table, il, ishape, idx, 'S'));
  const auto trusted = gs::take_along<"S">(t, i, gs::Bounds::trusted);
  CHECK(trusted.to_global() == r.to_global());
}

template <class Val, class Ids, gs::fixed_string Batch, class Mesh>
void scatter_case(const Mesh& mesh, const std::string& vl, const Shape& vshape,
                  const std::string& il, const Shape& ishape, Int n, unsigned salt) {
  const Global values{vl, vshape, values_of(product(vshape), salt)};
  const std::vector<Int> idx = indices_of(product(ishape), n, salt + 3);
  const auto v = make_from<Val>(mesh, vshape, values.values);
  const auto i = ids_from<Ids>(mesh, ishape, idx);
  const auto r = gs::scatter_add_along<"S", Batch>(v, i, n);
  check_result(r, naive_scatter_along(values, il, ishape, idx, 'S', n, std::string(Batch.view())));
}

template <class M>
void take_cases(const M& mesh) {
  using I32 = std::int32_t;
  using I64 = std::int64_t;
  // The MoE fast path: G over x, S unsplit, M over y (kept: the indices leave y free).
  {
    using Tab = gs::Sharded<double, M, "G:x S M:y">;
    using Ids = gs::Sharded<I32, M, "G:x E C">;
    static_assert(
        std::is_same_v<decltype(gs::take_along<"S">(std::declval<Tab>(), std::declval<Ids>())),
                       gs::Sharded<double, M, "G:x E C M:y">>);
    take_case<Tab, Ids>(mesh, "GSM", {3, 5, 3}, "GEC", {3, 2, 3}, 1);
  }
  // G over x*y, float, int64.
  {
    using Tab = gs::Sharded<float, M, "G:x*y S M">;
    using Ids = gs::Sharded<I64, M, "G:x*y E C">;
    static_assert(
        std::is_same_v<decltype(gs::take_along<"S">(std::declval<Tab>(), std::declval<Ids>())),
                       gs::Sharded<float, M, "G:x*y E C M">>);
    take_case<Tab, Ids>(mesh, "GSM", {5, 4, 2}, "GEC", {5, 3, 2}, 2);
  }
  // Replicated.
  take_case<gs::Sharded<double, M, "G S M">, gs::Sharded<I64, M, "G E C">>(mesh, "GSM", {2, 6, 3},
                                                                           "GEC", {2, 2, 3}, 3);
  // Not in place: S split (gathered), G split differently (takes y from the indices), M on y
  // (taken by the indices: replicated); the batch label not first in either.
  {
    using Tab = gs::Sharded<double, M, "S:x M:y G">;
    using Ids = gs::Sharded<I32, M, "E G:y C">;
    static_assert(
        std::is_same_v<decltype(gs::take_along<"S">(std::declval<Tab>(), std::declval<Ids>())),
                       gs::Sharded<double, M, "E G:y C M">>);
    take_case<Tab, Ids>(mesh, "SMG", {7, 3, 3}, "EGC", {2, 3, 3}, 4);
  }
  // No batch label: a plain gather with a -1 for "none"; E split over S's axis.
  {
    using Tab = gs::Sharded<float, M, "S:y M:x">;
    using Ids = gs::Sharded<I64, M, "E:y C">;
    static_assert(
        std::is_same_v<decltype(gs::take_along<"S">(std::declval<Tab>(), std::declval<Ids>())),
                       gs::Sharded<float, M, "E:y C M:x">>);
    take_case<Tab, Ids>(mesh, "SM", {5, 3}, "EC", {3, 3}, 5);
  }
  // Two batch labels, one split.
  take_case<gs::Sharded<double, M, "H G:x S M">, gs::Sharded<I32, M, "G:x H C">>(
      mesh, "HGSM", {2, 3, 4, 2}, "GHC", {3, 2, 3}, 6);
  // Three axes: the indices' E keeps y; M keeps z.
  if constexpr (M::axis_count == 3) {
    using Tab = gs::Sharded<double, M, "G:x S M:z">;
    using Ids = gs::Sharded<I32, M, "G:x E:y C">;
    static_assert(
        std::is_same_v<decltype(gs::take_along<"S">(std::declval<Tab>(), std::declval<Ids>())),
                       gs::Sharded<double, M, "G:x E:y C M:z">>);
    take_case<Tab, Ids>(mesh, "GSM", {3, 5, 3}, "GEC", {3, 3, 2}, 7);
  }
  // A pending partial table (K contracted over y) stays pending: take_along is linear in it.
  {
    using A = gs::Sharded<double, M, "G:x S M K:y">;
    using W = gs::Sharded<double, M, "K:y">;
    using Ids = gs::Sharded<I64, M, "G:x E C">;
    const Shape ashape{3, 4, 2, 3};
    const std::vector<double> av = values_of(product(ashape), 8);
    const auto a = make_from<A>(mesh, ashape, av);
    const auto w = make_from<W>(mesh, {3}, {1.0, 0.5, -2.0});
    Global table{"GSM", {3, 4, 2}, std::vector<double>(24, 0.0)};
    for (std::size_t e = 0; e < 24; ++e)
      table.values[e] = av[e * 3] + 0.5 * av[e * 3 + 1] - 2 * av[e * 3 + 2];
    const std::vector<Int> idx = indices_of(3 * 2 * 2, 4, 9);
    const auto i = ids_from<Ids>(mesh, {3, 2, 2}, idx);
    gs::comm_counters().reset();
    const auto r = gs::take_along<"S">(gs::einsum<"GSMK,K->GSM">(a, w), i, gs::Bounds::trusted);
    using R = std::remove_cvref_t<decltype(r)>;
    CHECK(gs::comm_counters().total().calls == 0);  // the partial sum is still pending
    CHECK(R::layout.is_partial(1));
    check_result(r, naive_take_along(table, "GEC", {3, 2, 2}, idx, 'S'));
  }
}

template <class M>
void scatter_cases(const M& mesh) {
  using I32 = std::int32_t;
  using I64 = std::int64_t;
  // The MoE combine: values "G:x E C M:y" -> "G:x S M:y", in place.
  {
    using Val = gs::Sharded<double, M, "G:x E C M:y">;
    using Ids = gs::Sharded<I32, M, "G:x E C">;
    static_assert(std::is_same_v<decltype(gs::scatter_add_along<"S", "G">(std::declval<Val>(),
                                                                          std::declval<Ids>(), 1)),
                                 gs::Sharded<double, M, "G:x S M:y">>);
    scatter_case<Val, Ids, "G">(mesh, "GECM", {3, 2, 3, 3}, "GEC", {3, 2, 3}, 5, 1);
  }
  // Values' order not the result's, G over x*y, float, int64.
  {
    using Val = gs::Sharded<float, M, "M G:x*y E C">;
    using Ids = gs::Sharded<I64, M, "G:x*y E C">;
    static_assert(std::is_same_v<decltype(gs::scatter_add_along<"S", "G">(std::declval<Val>(),
                                                                          std::declval<Ids>(), 1)),
                                 gs::Sharded<float, M, "G:x*y S M">>);
    scatter_case<Val, Ids, "G">(mesh, "MGEC", {2, 5, 2, 3}, "GEC", {5, 2, 3}, 4, 2);
  }
  // The indices split otherwise (brought to the values' splits); E over x: pending over x.
  {
    using Val = gs::Sharded<double, M, "G E:x C M:y">;
    using Ids = gs::Sharded<I64, M, "G E C:y">;
    static_assert(std::is_same_v<decltype(gs::scatter_add_along<"S", "G">(std::declval<Val>(),
                                                                          std::declval<Ids>(), 1)),
                                 gs::Sharded<double, M, "G S M:y +x">>);
    scatter_case<Val, Ids, "G">(mesh, "GECM", {2, 3, 2, 3}, "GEC", {2, 3, 2}, 6, 3);
  }
  // No batch label (the default): a plain scatter skipping negatives; replicated indices.
  {
    using Val = gs::Sharded<float, M, "E:y C M:x">;
    using Ids = gs::Sharded<I32, M, "E C">;
    static_assert(std::is_same_v<decltype(gs::scatter_add_along<"S">(std::declval<Val>(),
                                                                     std::declval<Ids>(), 1)),
                                 gs::Sharded<float, M, "S M:x +y">>);
    scatter_case<Val, Ids, "">(mesh, "ECM", {3, 3, 3}, "EC", {3, 3}, 5, 4);
  }
  // Two batch labels, written with a space; replicated.
  scatter_case<gs::Sharded<double, M, "H G E M">, gs::Sharded<I64, M, "G H E">, "G H">(
      mesh, "HGEM", {2, 3, 3, 2}, "GHE", {3, 2, 3}, 4, 5);
  if constexpr (M::axis_count == 3) {
    using Val = gs::Sharded<double, M, "G:x E:y C M:z">;
    using Ids = gs::Sharded<I32, M, "G:x E:y C">;
    static_assert(std::is_same_v<decltype(gs::scatter_add_along<"S", "G">(std::declval<Val>(),
                                                                          std::declval<Ids>(), 1)),
                                 gs::Sharded<double, M, "G:x S M:z +y">>);
    scatter_case<Val, Ids, "G">(mesh, "GECM", {3, 3, 2, 3}, "GEC", {3, 3, 2}, 6, 6);
  }
}

TEST_CASE("take_along equals a naive loop on every mesh shape") {
  on_every_mesh([](const auto& mesh) { take_cases(mesh); });
}

TEST_CASE("scatter_add_along equals a naive loop on every mesh shape") {
  on_every_mesh([](const auto& mesh) { scatter_cases(mesh); });
}

// Dispatch and combine of a MoE layer: batch labels split alike, S unsplit. Trusted: no
// collective at all; checked: one AllReduce of 3 int64 over the axes splitting the indices.
TEST_CASE("the MoE fast path runs no collective; the bounds check runs one") {
  on_every_mesh([](const auto& mesh) {
    using M = std::remove_cvref_t<decltype(mesh)>;
    using Tab = gs::Sharded<double, M, "G:x*y S M">;
    using Ids = gs::Sharded<std::int32_t, M, "G:x*y E C">;
    const Int G = 9, S = 6, E = 2, C = 3, Md = 4;
    const Global table{"GSM", {G, S, Md}, values_of(G * S * Md, 11)};
    const std::vector<Int> idx = indices_of(G * E * C, S, 12);
    const auto t = make_from<Tab>(mesh, table.shape, table.values);
    const auto i = ids_from<Ids>(mesh, {G, E, C}, idx);
    const int k = mesh.sizes()[0] * mesh.sizes()[1];
    gs::comm_counters().reset();
    const auto d = gs::take_along<"S">(t, i, gs::Bounds::trusted);
    const auto back = gs::scatter_add_along<"S", "G">(d, i, S, gs::Bounds::trusted);
    CHECK(gs::comm_counters().total().calls == 0);
    CHECK(gs::comm_counters().total().bytes == 0);
    const Global want_d = naive_take_along(table, "GEC", {G, E, C}, idx, 'S');
    check_result(d, want_d);
    check_result(back, naive_scatter_along(want_d, "GEC", {G, E, C}, idx, 'S', S, "G"));
    gs::comm_counters().reset();
    (void)gs::take_along<"S">(t, i);
    (void)gs::scatter_add_along<"S", "G">(d, i, S);
    CHECK(gs::comm_counters().total().calls == (k > 1 ? 2 : 0));
    CHECK(gs::comm_counters().total().bytes == (k > 1 ? 2 * (2 * (k - 1) * 24 / k) : 0));
  });
}

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
  } catch (const gs::Error& e) {
    return e.what();
  }
  return "";
}

TEST_CASE("take_along and scatter_add_along errors are the same on every rank") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  const Int S = 5, D = 3, B = 8;
  const auto t = gs::full<gs::Sharded<double, M, "S D">>(mesh, {S, D}, 1.0);
  // One index too large, on the last rank's shard only; -1 is fine.
  std::vector<std::int32_t> ids(static_cast<std::size_t>(B), 1);
  ids[B - 1] = 9;
  ids[0] = -1;
  const auto i = gs::from_global<gs::Sharded<std::int32_t, M, "B:x">>(mesh, {B}, ids);
  {
    const std::string msg = message_of([&] { (void)gs::take_along<"S">(t, i); });
    CHECK(msg.find("take_along<\"S\">") != std::string::npos);
    CHECK(msg.find("below 5") != std::string::npos);
    CHECK(msg.find("from 9 to 9") != std::string::npos);
    CHECK(msg.find("\"S D\" of shape [5, 3]") != std::string::npos);
    CHECK(same_everywhere(msg));
    const auto x = gs::full<gs::Sharded<double, M, "B:x D">>(mesh, {B, D}, 1.0);
    const std::string msg2 = message_of([&] { (void)gs::scatter_add_along<"S">(x, i, S); });
    CHECK(msg2.find("scatter_add_along<\"S\", \"\">") != std::string::npos);
    CHECK(msg2.find("from 9 to 9") != std::string::npos);
    CHECK(same_everywhere(msg2));
    // Trusted: no check; the index 9 selects nothing.
    const auto r = gs::take_along<"S">(t, i, gs::Bounds::trusted);
    const std::vector<double> got = r.to_global();
    CHECK(got[0] == 0.0);
    CHECK(got[static_cast<std::size_t>(D)] == 1.0);
    CHECK(got[static_cast<std::size_t>((B - 1) * D)] == 0.0);
  }
  // Batch sizes that disagree.
  {
    const auto tg = gs::full<gs::Sharded<double, M, "G:x S D">>(mesh, {3, S, D}, 1.0);
    const auto ig = gs::full<gs::Sharded<std::int64_t, M, "G E">>(mesh, {4, 2}, 0);
    const std::string msg = message_of([&] { (void)gs::take_along<"S">(tg, ig); });
    CHECK(msg.find("batch label 'G' has size 3 in the table but 4 in the indices") !=
          std::string::npos);
    CHECK(same_everywhere(msg));
    const auto x = gs::full<gs::Sharded<double, M, "G:x E D">>(mesh, {3, 2, D}, 1.0);
    const std::string msg2 = message_of([&] { (void)gs::scatter_add_along<"S", "G">(x, ig, S); });
    CHECK(msg2.find("label 'G' has size 3 in the values but 4 in the indices") !=
          std::string::npos);
    CHECK(same_everywhere(msg2));
    const auto ig3 = gs::full<gs::Sharded<std::int64_t, M, "G E">>(mesh, {3, 2}, 0);
    CHECK(message_of([&] { (void)gs::scatter_add_along<"S", "G">(x, ig3, -1); }).find("negative") !=
          std::string::npos);
  }
  // The run-time engines reject what the typed API rejects at compile time.
  {
    const auto names = gs::detail::axis_name_list<M>();
    const auto rt = gs::detail::runtime_tensor(t);
    const auto rs =
        gs::detail::runtime_tensor(gs::full<gs::Sharded<std::int32_t, M, "B S">>(mesh, {2, S}, 0));
    CHECK(message_of([&] {
            (void)gs::detail::take_along_runtime<double>('Q', gshard::detail::mesh_state(mesh),
                                                         names, rt, rs);
          }).find("no label 'Q'") != std::string::npos);
    CHECK(message_of([&] {
            (void)gs::detail::take_along_runtime<double>('S', gshard::detail::mesh_state(mesh),
                                                         names, rt, rs);
          }).find("also a label of the indices") != std::string::npos);
    const auto rx =
        gs::detail::runtime_tensor(gs::full<gs::Sharded<double, M, "B D">>(mesh, {2, D}, 1.0));
    const auto rb =
        gs::detail::runtime_tensor(gs::full<gs::Sharded<std::int32_t, M, "B">>(mesh, {2}, 0));
    CHECK(message_of([&] {
            (void)gs::detail::scatter_add_along_runtime<double>(
                'S', "D", S, gshard::detail::mesh_state(mesh), names, rx, rb);
          }).find("batch label 'D' is not a label of the indices") != std::string::npos);
  }
}

}  // namespace
