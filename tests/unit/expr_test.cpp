// Lazy expressions: elementwise ops (broadcasting by label, layouts merged by the documented
// rules, partial sums kept through linear ops and summed before others), fusion into one
// kernel, evaluation at most once, operands owned by the expression, explain() with source lines
// and collectives, and errors. Values are checked against naive loops over the global tensors
// (to_global of the inputs), on every listed mesh shape, with uneven sizes drawn per run.
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "block_reference.hpp"
#include "mpi_test.hpp"

namespace {

namespace gs = gshard;
using gs::Shape;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;
using M2 = gs::Mesh<"x", "y">;
using M3 = gs::Mesh<"x", "y", "z">;

// --- the reference: global tensors indexed by label ---------------------------------------------

struct Global {
  std::string labels;
  Shape shape;
  std::vector<double> v;

  double at(const std::map<char, Int>& idx) const {
    Int flat = 0;
    for (std::size_t d = 0; d < labels.size(); ++d) flat = flat * shape[d] + idx.at(labels[d]);
    return v[static_cast<std::size_t>(flat)];
  }
};

template <class S>
std::string labels_of() {
  std::string s;
  for (int d = 0; d < S::layout.rank; ++d) s += S::layout.dims[d].label;
  return s;
}

template <class E>
Global global(const E& e) {
  using S = typename E::result_type;
  const S s = e.eval();
  const auto g = s.to_global();
  return {labels_of<S>(), s.shape(), std::vector<double>(g.begin(), g.end())};
}
template <class T, class M, gs::fixed_string Spec>
Global global(const gs::Sharded<T, M, Spec>& s) {
  const auto g = s.to_global();
  return {labels_of<gs::Sharded<T, M, Spec>>(), s.shape(), std::vector<double>(g.begin(), g.end())};
}

// Checks `got` (a tensor or expression) against f(index by label) at every global index.
template <class E, class F>
void check_values(const E& got, F&& f, double tol, const std::string& what) {
  const Global g = global(got);
  std::map<char, Int> idx;
  for (char c : g.labels) idx[c] = 0;
  Int bad = 0;
  std::string first;
  for (std::size_t i = 0; i < g.v.size(); ++i) {
    Int rest = static_cast<Int>(i);
    for (std::size_t d = g.labels.size(); d-- > 0;) {
      idx[g.labels[d]] = rest % g.shape[d];
      rest /= g.shape[d];
    }
    const double want = f(idx);
    if (!(std::abs(g.v[i] - want) <= tol * (1 + std::abs(want)))) {
      if (bad++ == 0)
        first = "at flat " + std::to_string(i) + ": got " + std::to_string(g.v[i]) + ", want " +
                std::to_string(want);
    }
  }
  CHECK_MESSAGE(bad == 0, what << ": " << bad << " wrong values, first " << first);
}

struct Sizes {
  std::mt19937 rng{20261202};  // the same on every rank
  Int operator()() { return std::uniform_int_distribution<Int>(1, 9)(rng); }
};

Int allreduce_calls() {
  Int n = 0;
  for (const auto& [key, c] : gs::comm_counters().all())
    if (key.second == gs::Collective::all_reduce) n += c.calls;
  return n;
}
Int collective_calls() { return gs::comm_counters().total().calls; }

// --- value cases, templated on the mesh type (specs name axes x and y only) ---------------------

template <class M>
void broadcast_by_label(const M& mesh, Sizes& n, const std::string& where) {
  const Int G = n(), S = n(), D = n();
  using X = gs::Sharded<double, M, "G:x S D">;
  using B = gs::Sharded<double, M, "D">;
  using Y = gs::Sharded<double, M, "S:y">;
  const auto x = gs::random_normal<X>(mesh, {G, S, D}, 1);
  const auto b = gs::random_normal<B>(mesh, {D}, 2);
  const auto y = gs::random_normal<Y>(mesh, {S}, 3);
  const auto r = x + b * 3.0 - y;
  static_assert(decltype(r)::spec == gs::fixed_string("G:x S:y D"));
  const Global gx = global(x), gb = global(b), gy = global(y);
  check_values(
      r, [&](const auto& i) { return gx.at(i) + gb.at(i) * 3.0 - gy.at(i); }, 1e-12,
      "x(\"G:x S D\") + b(\"D\") * 3 - y(\"S:y\") " + where);
}

template <class M>
void orders_and_splits_merge(const M& mesh, Sizes& n, const std::string& where) {
  const Int G = n(), S = n(), D = n();
  using X = gs::Sharded<double, M, "G S:y D">;
  using Y = gs::Sharded<double, M, "D G:x S">;
  const auto x = gs::random_normal<X>(mesh, {G, S, D}, 4);
  const auto y = gs::random_normal<Y>(mesh, {D, G, S}, 5);
  const Int before = collective_calls();
  const auto r = x * y - x;
  static_assert(decltype(r)::spec == gs::fixed_string("G:x S:y D"));
  (void)r.eval();
  CHECK_MESSAGE(collective_calls() == before, "slicing replicated dimensions moves nothing");
  const Global gx = global(x), gy = global(y);
  check_values(
      r, [&](const auto& i) { return gx.at(i) * gy.at(i) - gx.at(i); }, 1e-12,
      "x(\"G S:y D\") * y(\"D G:x S\") - x " + where);
}

template <class M>
void every_unary_op(const M& mesh, Sizes& n, const std::string& where) {
  const Int I = n(), J = n();
  using X = gs::Sharded<double, M, "I:y J:x">;
  const auto x = gs::random_uniform<X>(mesh, {I, J}, 6, 0.2, 2.0);
  const auto r = gs::sqrt(x) + gs::rsqrt(x) + gs::tanh(x) * gs::sigmoid(x) - gs::gelu(x) +
                 gs::square(x) + gs::abs(-x) + gs::log(x) + gs::pow(x, 1.5) + gs::minimum(x, 0.7) +
                 gs::maximum(0.9, x) + gs::relu(x - 1.0) + gs::exp(-x) + gs::neg(x) / 4.0 + 2.0 / x;
  const Global gx = global(x);
  check_values(
      r,
      [&](const auto& i) {
        const double v = gx.at(i);
        const double gelu = 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
        return std::sqrt(v) + 1 / std::sqrt(v) + std::tanh(v) / (1 + std::exp(-v)) - gelu + v * v +
               std::abs(v) + std::log(v) + std::pow(v, 1.5) + std::min(v, 0.7) + std::max(0.9, v) +
               std::max(v - 1.0, 0.0) + std::exp(-v) - v / 4.0 + 2.0 / v;
      },
      1e-12, "every unary op " + where);
}

template <class M>
void where_and_casts(const M& mesh, Sizes& n, const std::string& where) {
  const Int I = n(), J = n();
  using X = gs::Sharded<double, M, "I:x J">;
  using Y = gs::Sharded<double, M, "J:y">;
  const auto x = gs::random_normal<X>(mesh, {I, J}, 7);
  const auto y = gs::random_normal<Y>(mesh, {J}, 8);
  const auto c = gs::cast<std::int32_t>(x * 2.0);
  const auto r = gs::where(c, x, -1.0) + gs::cast<double>(gs::cast<float>(y));
  static_assert(std::is_same_v<typename decltype(c)::value_type, std::int32_t>);
  const Global gx = global(x), gy = global(y);
  check_values(
      r,
      [&](const auto& i) {
        const double v = gx.at(i);
        return (static_cast<std::int32_t>(v * 2.0) != 0 ? v : -1.0) +
               static_cast<double>(static_cast<float>(gy.at(i)));
      },
      1e-12, "where(cast<int32>(2x), x, -1) + cast<double>(cast<float>(y)) " + where);
  // Integer tensors: + - * / and where in int64 arithmetic.
  using K = gs::Sharded<std::int64_t, M, "I J:y">;
  const auto k = gs::random_uniform<K>(mesh, {I, J}, 9, -20, 20);
  const auto q = gs::where(k, k * 3 - 7, std::int64_t{5}) / 2;
  const Global gk = global(k);
  check_values(
      q,
      [&](const auto& i) {
        const auto v = static_cast<std::int64_t>(gk.at(i));
        return static_cast<double>((v != 0 ? v * 3 - 7 : 5) / 2);
      },
      0, "int64 where/arith " + where);
}

template <class M>
void partial_sums(const M& mesh, Sizes& n, const std::string& where) {
  const Int I = n(), K = n(), J = n();
  using A = gs::Sharded<double, M, "I:x K:y">;
  using B = gs::Sharded<double, M, "K:y J">;
  const auto a = gs::random_normal<A>(mesh, {I, K}, 10);
  const auto b = gs::random_normal<B>(mesh, {K, J}, 11);
  const auto h = gs::einsum<"IK,KJ->IJ">(a, b);
  static_assert(decltype(h)::spec == gs::fixed_string("I:x J +y"));
  const Global ga = global(a), gb = global(b);
  auto mm = [&](const std::map<char, Int>& i) {
    double s = 0;
    std::map<char, Int> t = i;
    for (Int k = 0; k < K; ++k) {
      t['K'] = k;
      s += ga.at(t) * gb.at(t);
    }
    return s;
  };
  (void)h.eval();
  // Linear ops keep the partial sum pending: no collective, the type says "+y".
  const Int before = collective_calls();
  const auto lin = (h + h) * 0.5 - h / 4.0 - (-h);
  static_assert(decltype(lin)::spec == gs::fixed_string("I:x J +y"));
  (void)lin.eval();
  CHECK_MESSAGE(collective_calls() == before, "linear ops on partial sums communicate nothing");
  check_values(
      lin, [&](const auto& i) { return 1.75 * mm(i); }, 1e-11, "linear ops on a partial " + where);
  // A non-linear op sums the partial first: one AllReduce over y (when y has several ranks).
  const Int ar = allreduce_calls();
  const auto r = gs::relu(h) + 1.0;
  static_assert(decltype(r)::spec == gs::fixed_string("I:x J"));
  (void)r.eval();
  const bool y_split = mesh.sizes()[1] > 1;
  CHECK_MESSAGE(allreduce_calls() - ar == (y_split ? 1 : 0), "one AllReduce finishes the partial");
  check_values(
      r, [&](const auto& i) { return std::max(mm(i), 0.0) + 1.0; }, 1e-11,
      "relu(partial) + 1 " + where);
  // A scalar added to a partial is not linear either.
  check_values(
      h + 2.0, [&](const auto& i) { return mm(i) + 2.0; }, 1e-11, "partial + scalar " + where);
}

template <class M>
void conflicting_splits_reshard(const M& mesh, Sizes& n, const std::string& where) {
  const Int I = n(), J = n();
  using A = gs::Sharded<double, M, "I:x J">;
  using B = gs::Sharded<double, M, "I J:x">;
  const auto a = gs::random_normal<A>(mesh, {I, J}, 12);
  const auto b = gs::random_normal<B>(mesh, {I, J}, 13);
  const auto r = a - b;
  static_assert(decltype(r)::spec == gs::fixed_string("I:x J"));
  const Global ga = global(a), gb = global(b);
  check_values(
      r, [&](const auto& i) { return ga.at(i) - gb.at(i); }, 1e-12,
      "a(\"I:x J\") - b(\"I J:x\") " + where);
  // Expressions feed einsums, and an assignment is an annotation (resharded to its type).
  using C = gs::Sharded<double, M, "J:y K">;
  const Int K = n();
  const auto c = gs::random_normal<C>(mesh, {J, K}, 14);
  const gs::Sharded<double, M, "K I:y"> e = gs::einsum<"IJ,JK->IK">(gs::relu(a), c + 1.0) * 2.0;
  const Global gc = global(c);
  check_values(
      e,
      [&](std::map<char, Int> i) {
        double s = 0;
        for (Int j = 0; j < J; ++j) {
          i['J'] = j;
          s += std::max(ga.at(i), 0.0) * (gc.at(i) + 1.0);
        }
        return 2 * s;
      },
      1e-11, "einsum(relu(a), c + 1) * 2 into \"K I:y\" " + where);
}

template <class M>
void all_value_cases(const M& mesh, Sizes& sizes, const std::string& where) {
  broadcast_by_label(mesh, sizes, where);
  orders_and_splits_merge(mesh, sizes, where);
  every_unary_op(mesh, sizes, where);
  where_and_casts(mesh, sizes, where);
  partial_sums(mesh, sizes, where);
  conflicting_splits_reshard(mesh, sizes, where);
}

std::string mesh_name(const std::vector<int>& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) out.append(i ? "x" : "").append(std::to_string(s[i]));
  return std::string("on mesh ").append(out);
}

// --- Kokkos profiling hooks: kernel launches and allocations ------------------------------------

int launches = 0, allocations = 0, einsum_allocations = 0;
void on_launch(const char*, std::uint32_t, std::uint64_t* id) {
  ++launches;
  *id = 0;
}
void on_allocate(Kokkos::Tools::SpaceHandle, const char* label, const void*, std::uint64_t) {
  ++allocations;
  if (std::string(label) == "gshard::einsum") ++einsum_allocations;
}
struct Hooks {
  Hooks() {
    launches = allocations = einsum_allocations = 0;
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(on_launch);
    Kokkos::Tools::Experimental::set_allocate_data_callback(on_allocate);
  }
  ~Hooks() {
    Kokkos::Tools::Experimental::set_begin_parallel_for_callback(nullptr);
    Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr);
  }
};

// Built from locals that die here: the expression must own its operands.
auto expression_outliving_its_operands(const M2& mesh) {
  using X = gs::Sharded<double, M2, "I:x J">;
  auto x = gs::full<X>(mesh, {5, 3}, 2.0);
  auto w = gs::full<X>(mesh, {4, 3}, 0.5).as<"KJ">();
  auto bias = gs::full<gs::Sharded<double, M2, "K">>(mesh, {4}, 1.0);
  auto h = gs::einsum<"IJ,KJ->IK">(x, w);
  return gs::exp(h) + bias;
}

}  // namespace

TEST_CASE("elementwise expressions: values on every mesh shape, uneven sizes") {
  Sizes sizes;
  for (const auto& s : gshard::test::listed_mesh_shapes(world_size())) {
    if (s.size() == 2) {
      const M2 mesh(MPI_COMM_WORLD, {s[0], s[1]});
      all_value_cases(mesh, sizes, mesh_name(s));
    } else {
      const M3 mesh(MPI_COMM_WORLD, {s[0], s[1], s[2]});
      all_value_cases(mesh, sizes, mesh_name(s));
    }
  }
}

TEST_CASE("fusion: five chained elementwise ops launch one kernel and allocate one output") {
  for (const auto& s : gshard::test::listed_mesh_shapes(world_size())) {
    if (s.size() != 2) continue;
    const M2 mesh(MPI_COMM_WORLD, {s[0], s[1]});
    using X = gs::Sharded<float, M2, "I:x J">;
    using Y = gs::Sharded<float, M2, "J">;
    using Z = gs::Sharded<float, M2, "I:x J:y">;
    const auto x = gs::random_normal<X>(mesh, {7, 10}, 1);
    const auto y = gs::random_normal<Y>(mesh, {10}, 2);
    const auto z = gs::random_normal<Z>(mesh, {7, 10}, 3);
    int kernel_launches = 0, allocated = 0;
    Z r(mesh, {0, 0});
    {
      const Hooks hooks;
      // mul, add, relu, sub, exp: five ops over three tensors (broadcast and sliced in place).
      r = gs::exp(gs::relu(x * 2.0f + y) - z);
      kernel_launches = launches;
      allocated = allocations;
    }
    CHECK(kernel_launches == 1);
    CHECK(allocated == 1);
    const Global gx = global(x), gy = global(y), gz = global(z);
    check_values(
        r,
        [&](const auto& i) {
          const float v =
              std::max(static_cast<float>(gx.at(i)) * 2.0f + static_cast<float>(gy.at(i)), 0.0f) -
              static_cast<float>(gz.at(i));
          return static_cast<double>(std::exp(v));
        },
        1e-5, "exp(relu(x * 2 + y) - z) " + mesh_name(s));
  }
}

TEST_CASE("an expression evaluates at most once, and its implicit collectives run once") {
  const int n = world_size();
  const M2 mesh(MPI_COMM_WORLD, {1, n});
  using A = gs::Sharded<double, M2, "I K:y">;
  using B = gs::Sharded<double, M2, "K:y J">;
  const auto a = gs::random_normal<A>(mesh, {6, 8}, 1);
  const auto b = gs::random_normal<B>(mesh, {8, 5}, 2);
  int einsums = 0;
  const Int ar = allreduce_calls();
  {
    const Hooks hooks;
    const auto h = gs::einsum<"IK,KJ->IJ">(a, b);  // partial over y
    const gs::Sharded<double, M2, "I J"> r1 = gs::relu(h);
    const gs::Sharded<double, M2, "I J"> r2 = gs::exp(h) * 2.0;
    const auto r3 = h.eval();
    const auto r4 = h.eval();
    CHECK(r3.local_view().data() == r4.local_view().data());
    einsums = einsum_allocations;
  }
  CHECK(einsums == 1);
  CHECK(allreduce_calls() - ar == (n > 1 ? 1 : 0));
}

TEST_CASE("expressions own their operands") {
  const M2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  const auto e = expression_outliving_its_operands(mesh);
  check_values(
      e, [](const auto&) { return std::exp(3.0) + 1.0; }, 1e-12, "exp(x . w) + bias");
}

TEST_CASE("explain shows each op, its source line, its kernel and its implicit collectives") {
  const int n = world_size();
  const M2 mesh(MPI_COMM_WORLD, {1, n});
  using A = gs::Sharded<double, M2, "I K:y">;
  using B = gs::Sharded<double, M2, "K:y J">;
  using C = gs::Sharded<double, M2, "I J:y">;
  const auto a = gs::random_normal<A>(mesh, {6, 8}, 1);
  const auto b = gs::random_normal<B>(mesh, {8, 5}, 2);
  const auto c = gs::random_normal<C>(mesh, {6, 5}, 3);
  const int einsum_line = __LINE__ + 1;
  const auto h = gs::einsum<"IK,KJ->IJ">(a, b);
  const int add_line = __LINE__ + 1;
  const auto r = gs::tanh(h) + c;
  const std::string text = gs::explain(r);
  INFO(text);
  CHECK(text.find("einsum \"IK,KJ->IJ\"   at expr_test.cpp:" + std::to_string(einsum_line)) !=
        std::string::npos);
  CHECK(text.find("batched GEMM, batch 1, m 6, n 5, k " + std::to_string((8 + n - 1) / n)) !=
        std::string::npos);
  CHECK(text.find("fused elementwise add(tanh(%0), in2)   at expr_test.cpp:" +
                  std::to_string(add_line)) != std::string::npos);
  // The result takes c's split of J, so the partial sum of h is finished straight into it.
  CHECK(text.find("result: \"I J:y\" [6, 5]") != std::string::npos);
  if (n > 1) {
    // tanh needs the partial sum of h finished: a ReduceScatter over y, the bytes it will send.
    gs::comm_counters().reset();
    (void)r.eval();
    const gs::CommCount rs = gs::comm_counters().get("y", gs::Collective::reduce_scatter);
    CHECK(rs.calls == 1);
    CHECK(gs::comm_counters().total().calls == 1);
    CHECK(text.find("ReduceScatter over y") != std::string::npos);
    CHECK(text.find("1 implicit collective(s), " + std::to_string(rs.bytes) + " bytes") !=
          std::string::npos);
  }
}

TEST_CASE("elementwise errors name the op, the label, the shapes and the layouts, on every rank") {
  const M2 mesh(MPI_COMM_WORLD, {world_size(), 1});
  using X = gs::Sharded<double, M2, "I:x J">;
  using B = gs::Sharded<double, M2, "J">;
  const auto x = gs::zeros<X>(mesh, {4, 5});
  const auto b = gs::zeros<B>(mesh, {6});
  std::string message;
  try {
    (void)(x + b).eval();
  } catch (const gs::Error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("add") != std::string::npos);
  CHECK(message.find("label 'J' has size 6") != std::string::npos);
  CHECK(message.find("\"I:x J\" of global shape [4, 5]") != std::string::npos);
}
