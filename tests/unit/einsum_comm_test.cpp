// Einsum communication, case by case along GShard's rules: which collectives an einsum (and the
// reshard that finishes its partial result) runs, over which axes, how many calls and how many
// bytes this rank sends (comm/counters.hpp: AllGather (k-1)*S, AllReduce 2(k-1)/k*S,
// ReduceScatter (k-1)/k*S of the input, CollectivePermute S or 0 when the partner is this rank,
// AllToAllv the bytes sent to others), with every expected number derived here from the sizes;
// and the values, checked on every rank's block with our own block arithmetic against a naive
// loop.
//
// Every case runs on each two-axis mesh Mesh<"x","y"> for the rank count (1x1; 1x2, 2x1; 1x4,
// 2x2, 4x1; 1x8, 2x4, 4x2, 8x1), the label-conflict cases also on Mesh<"x","y","z"> 2x2x2 at 8
// ranks. Sizes are multiples of 8 so that every block lines up and the volumes are exact.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"

namespace {

using gshard::Collective;
using gshard::Layout;
using gshard::Shape;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;
using M = gshard::Mesh<"x", "y">;
using M3 = gshard::Mesh<"x", "y", "z">;

constexpr Int elem = sizeof(double);

// --- our own geometry ---------------------------------------------------------------------------

struct Grid {
  std::vector<int> sizes;
  std::vector<int> coords;  // row-major, last axis fastest
};

Grid grid_of(const std::vector<int>& sizes) {
  Grid g{sizes, std::vector<int>(sizes.size())};
  int r = world_rank();
  for (std::size_t i = sizes.size(); i-- > 0;) {
    g.coords[i] = r % sizes[i];
    r /= sizes[i];
  }
  return g;
}

// Calls f(local index, global row-major index or -1 for padding) over this rank's padded block
// under `l` of a tensor of global shape `shape` (l's order). Blocks: ceil(n/k), row-major index
// over the dimension's axes, major first.
template <class F>
Int for_block(const Layout& l, const Shape& shape, const Grid& grid, F&& f) {
  const auto r = static_cast<std::size_t>(l.rank);
  std::vector<Int> chunk(r), offset(r), valid(r), stride(r);
  Int s = 1;
  for (std::size_t d = r; d-- > 0;) {
    stride[d] = s;
    s *= shape[d];
  }
  Int total = 1;
  for (std::size_t d = 0; d < r; ++d) {
    Int k = 1, index = 0;
    for (int i = 0; i < l.dims[d].axis_count; ++i) {
      const auto a = static_cast<std::size_t>(l.dims[d].axes[static_cast<std::size_t>(i)]);
      k *= grid.sizes[a];
      index = index * grid.sizes[a] + grid.coords[a];
    }
    chunk[d] = (shape[d] + k - 1) / k;
    offset[d] = index * chunk[d];
    valid[d] = std::max<Int>(0, std::min(shape[d], offset[d] + chunk[d]) - offset[d]);
    total *= chunk[d];
  }
  for (Int i = 0; i < total; ++i) {
    Int rest = i, g = 0;
    bool pad = false;
    for (std::size_t d = r; d-- > 0;) {
      const Int local = rest % chunk[d];
      rest /= chunk[d];
      if (local >= valid[d]) pad = true;
      g += (offset[d] + local) * stride[d];
    }
    f(i, pad ? Int{-1} : g);
  }
  return total;
}

std::string labels_of(const Layout& l) {
  std::string s;
  for (int d = 0; d < l.rank; ++d) s += l.dims[d].label;
  return s;
}

// Sizes of the labels: multiples of 8 (every split here divides them), K the longest.
Int size_of(char label) { return label == 'K' || label == 'M' ? 16 : 8; }

Shape shape_of(const Layout& l) {
  Shape s;
  for (char c : labels_of(l)) s.push_back(size_of(c));
  return s;
}

// Dyadic values: every sum below is exact.
std::vector<double> global_values(Int n, std::uint64_t salt) {
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = static_cast<double>(static_cast<Int>((i * 37 + salt * 101) % 61) - 30) / 16.0;
  return g;
}

// A tensor of type S holding `global` (row-major in S's order), its shard built by us.
template <class S>
S operand(const typename S::mesh_type& mesh, const Grid& grid, const std::vector<double>& global) {
  static_assert(S::layout.partial_count == 0);
  const Shape shape = shape_of(S::layout);
  std::vector<double> host;
  for_block(S::layout, shape, grid,
            [&](Int, Int g) { host.push_back(g < 0 ? 0.0 : global[static_cast<std::size_t>(g)]); });
  Kokkos::View<double*> view("operand", host.size());
  auto mirror = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < host.size(); ++i) mirror(i) = host[i];
  Kokkos::deep_copy(view, mirror);
  return S(mesh, shape, view);
}

// out[o] = sum of a[..] * b[..] over the labels the output drops.
std::vector<double> naive(const std::string& out, const std::string& la,
                          const std::vector<double>& a, const std::string& lb,
                          const std::vector<double>& b) {
  std::string all = out;
  for (char c : la + lb)
    if (all.find(c) == std::string::npos) all += c;
  const std::size_t n = all.size();
  std::vector<Int> size(n), sa(n, 0), sb(n, 0), so(n, 0);
  for (std::size_t d = 0; d < n; ++d) size[d] = size_of(all[d]);
  auto strides = [&](const std::string& labels, std::vector<Int>& st) {
    Int s = 1;
    for (std::size_t d = labels.size(); d-- > 0;) {
      st[all.find(labels[d])] = s;
      s *= size_of(labels[d]);
    }
  };
  strides(la, sa);
  strides(lb, sb);
  strides(out, so);
  Int total = 1, out_size = 1;
  for (auto s : size) total *= s;
  for (char c : out) out_size *= size_of(c);
  std::vector<double> r(static_cast<std::size_t>(out_size), 0.0);
  std::vector<Int> idx(n, 0);
  for (Int t = 0; t < total; ++t) {
    Int ia = 0, ib = 0, io = 0;
    for (std::size_t d = 0; d < n; ++d) {
      ia += idx[d] * sa[d];
      ib += idx[d] * sb[d];
      io += idx[d] * so[d];
    }
    r[static_cast<std::size_t>(io)] +=
        a[static_cast<std::size_t>(ia)] * b[static_cast<std::size_t>(ib)];
    for (std::size_t d = n; d-- > 0;) {
      if (++idx[d] < size[d]) break;
      idx[d] = 0;
    }
  }
  return r;
}

// This rank's block of a result (padding zero on every copy; a partial result summed over its
// partial axes) against `expect` (row-major in the result's label order). "" when right.
template <class S>
std::string check_block(const S& r, const Grid& grid, const std::vector<double>& expect) {
  auto mirror = Kokkos::create_mirror_view(r.local_view());
  Kokkos::deep_copy(mirror, r.local_view());
  std::vector<double> got(mirror.data(), mirror.data() + mirror.extent(0));
  std::vector<Int> global_of;
  for_block(S::layout, r.shape(), grid, [&](Int, Int g) { global_of.push_back(g); });
  if (got.size() != global_of.size())
    return "local size " + std::to_string(got.size()) + ", expected " +
           std::to_string(global_of.size());
  std::string wrong;
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i)
    if (global_of[i] < 0 && got[i] != 0.0)
      wrong = "padding element " + std::to_string(i) + " is not zero";
  unsigned mask = 0;
  for (int i = 0; i < S::layout.partial_count; ++i)
    mask |= 1u << S::layout.partial[static_cast<std::size_t>(i)];
  if (mask != 0)
    MPI_Allreduce(MPI_IN_PLACE, got.data(), static_cast<int>(got.size()), MPI_DOUBLE, MPI_SUM,
                  r.mesh().group(mask));
  for (std::size_t i = 0; i < got.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const double e = expect[static_cast<std::size_t>(global_of[i])];
    if (std::abs(got[i] - e) > 1e-12 * std::max(1.0, std::abs(e)))
      wrong = "local element " + std::to_string(i) + (mask ? " (summed over partial copies)" : "") +
              " is " + std::to_string(got[i]) + ", expected " + std::to_string(e);
  }
  return wrong;
}

// --- expected communication ---------------------------------------------------------------------

struct Expected {
  std::string axes;
  Collective kind;
  Int bytes;
};

std::string counters_text(
    const std::map<std::pair<std::string, Collective>, gshard::CommCount>& m) {
  std::ostringstream s;
  if (m.empty()) s << "(none)";
  for (const auto& [key, c] : m)
    s << ' ' << gshard::collective_name(key.second) << " over " << key.first << ": " << c.calls
      << " call(s), " << c.bytes << " bytes;";
  return s.str();
}

// Exactly the collectives in `want` ran since the last reset, one call each; entries of `want`
// over groups of one rank are dropped (such steps are local).
void check_comm(const std::vector<Expected>& want_all, const std::vector<int>& group_sizes,
                const std::string& what) {
  std::map<std::pair<std::string, Collective>, gshard::CommCount> want;
  for (std::size_t i = 0; i < want_all.size(); ++i)
    if (group_sizes[i] > 1)
      want[{want_all[i].axes, want_all[i].kind}] = gshard::CommCount{1, want_all[i].bytes};
  const auto& got = gshard::comm_counters().all();
  bool same = got.size() == want.size();
  for (const auto& [key, c] : want) {
    const auto it = got.find(key);
    same = same && it != got.end() && it->second.calls == c.calls && it->second.bytes == c.bytes;
  }
  INFO(what);
  INFO("expected:" << counters_text(want));
  INFO("counted: " << counters_text(got));
  CHECK(same);
}

void check_no_comm(const std::string& what) { check_comm({}, {}, what); }

std::string mesh_text(const std::vector<int>& s) {
  std::string t = "mesh ";
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i > 0) t += 'x';
    t += std::to_string(s[i]);
  }
  return t;
}

// Takes the tensor, not its type: nvcc 13 cannot spell a spec the library computed as an explicit
// template argument in a function body (docs/backends.md).
template <class R>
void check_spec(const R&, const std::string& expected, const std::string& what) {
  INFO(what);
  CHECK(std::string(R::spec_string()) == expected);
}

// Runs einsum<E>(A, B) on operands built from fixed global values; returns the result and the
// naive expected global (in the result's label order) through `expect`.
template <gshard::fixed_string E, class A, class B>
auto run_einsum(const typename A::mesh_type& mesh, const Grid& grid, std::vector<double>& expect) {
  const std::vector<double> ga = global_values(gshard::detail::product(shape_of(A::layout)), 1);
  const std::vector<double> gb = global_values(gshard::detail::product(shape_of(B::layout)), 2);
  const A a = operand<A>(mesh, grid, ga);
  const B b = operand<B>(mesh, grid, gb);
  gshard::comm_counters().reset();
  auto r = gshard::einsum<E>(a, b).eval();  // evaluated here, so the counters see it
  expect =
      naive(labels_of(decltype(r)::layout), labels_of(A::layout), ga, labels_of(B::layout), gb);
  return r;
}

std::vector<std::vector<int>> two_axis_shapes(int n) {
  std::vector<std::vector<int>> out;
  for (int a = 1; a <= n; ++a)
    if (n % a == 0) out.push_back({a, n / a});
  return out;
}

}  // namespace

TEST_CASE("einsum: batch label split the same way in both operands moves nothing") {
  for (const auto& s : two_axis_shapes(world_size())) {
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    const Grid grid = grid_of(s);
    const std::string where = " on " + mesh_text(s);
    std::vector<double> expect;
    {
      using A = gshard::Sharded<double, M, "B:x I K">;
      using B = gshard::Sharded<double, M, "B:x K J">;
      const auto r = run_einsum<"BIK,BKJ->BIJ", A, B>(mesh, grid, expect);
      check_no_comm("BIK,BKJ->BIJ, B split on x in both" + where);
      check_spec(r, "B:x I J", where);
      CHECK(check_block(r, grid, expect) == "");
    }
    {
      using A = gshard::Sharded<double, M, "B:y*x I K">;
      using B = gshard::Sharded<double, M, "K B:y*x J">;
      const auto r = run_einsum<"BIK,KBJ->BIJ", A, B>(mesh, grid, expect);
      check_no_comm("BIK,KBJ->BIJ, B split on y*x in both" + where);
      check_spec(r, "B:y*x I J", where);
      CHECK(check_block(r, grid, expect) == "");
    }
    {  // MoE: experts split on y in both, groups split on x in the activations.
      using A = gshard::Sharded<double, M, "E:y G:x S M">;
      using B = gshard::Sharded<double, M, "E:y M H">;
      const auto r = run_einsum<"EGSM,EMH->EGSH", A, B>(mesh, grid, expect);
      check_no_comm("EGSM,EMH->EGSH, E on y in both" + where);
      check_spec(r, "E:y G:x S H", where);
      CHECK(check_block(r, grid, expect) == "");
    }
  }
}

TEST_CASE(
    "einsum: contracting label split the same way in both -> partial, then AllReduce or "
    "ReduceScatter") {
  for (const auto& s : two_axis_shapes(world_size())) {
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    const Grid grid = grid_of(s);
    const std::string where = " on " + mesh_text(s);
    const int kx = s[0], ky = s[1];
    const Int I = size_of('I'), J = size_of('J');
    const Int S = I * J * elem;  // the partial result's local payload: I and J unsplit
    std::vector<double> expect;
    {
      using A = gshard::Sharded<double, M, "I K:y">;
      using B = gshard::Sharded<double, M, "K:y J">;
      const auto p = run_einsum<"IK,KJ->IJ", A, B>(mesh, grid, expect);
      check_no_comm("IK,KJ->IJ, K on y in both" + where);
      check_spec(p, "I J +y", where);
      CHECK(check_block(p, grid, expect) == "");

      gshard::comm_counters().reset();
      const auto full = gshard::reshard<gshard::Sharded<double, M, "I J">>(p);
      check_comm({{"y", Collective::all_reduce, 2 * (ky - 1) * S / ky}}, {ky},
                 "\"I J +y\" -> \"I J\"" + where);
      CHECK(check_block(full, grid, expect) == "");

      gshard::comm_counters().reset();
      const auto rows = gshard::reshard<gshard::Sharded<double, M, "I:y J">>(p);
      check_comm({{"y", Collective::reduce_scatter, (ky - 1) * S / ky}}, {ky},
                 "\"I J +y\" -> \"I:y J\"" + where);
      CHECK(check_block(rows, grid, expect) == "");

      gshard::comm_counters().reset();
      const auto cols = gshard::reshard<gshard::Sharded<double, M, "I J:y">>(p);
      check_comm({{"y", Collective::reduce_scatter, (ky - 1) * S / ky}}, {ky},
                 "\"I J +y\" -> \"I J:y\"" + where);
      CHECK(check_block(cols, grid, expect) == "");
    }
    {
      using A = gshard::Sharded<double, M, "K:x I">;
      using B = gshard::Sharded<double, M, "J K:x">;
      const auto p = run_einsum<"KI,JK->IJ", A, B>(mesh, grid, expect);
      check_no_comm("KI,JK->IJ, K on x in both" + where);
      check_spec(p, "I J +x", where);
      CHECK(check_block(p, grid, expect) == "");

      gshard::comm_counters().reset();
      const auto full = gshard::reshard<gshard::Sharded<double, M, "I J">>(p);
      check_comm({{"x", Collective::all_reduce, 2 * (kx - 1) * S / kx}}, {kx},
                 "\"I J +x\" -> \"I J\"" + where);
      CHECK(check_block(full, grid, expect) == "");

      gshard::comm_counters().reset();
      const auto rows = gshard::reshard<gshard::Sharded<double, M, "I:x J">>(p);
      check_comm({{"x", Collective::reduce_scatter, (kx - 1) * S / kx}}, {kx},
                 "\"I J +x\" -> \"I:x J\"" + where);
      CHECK(check_block(rows, grid, expect) == "");
    }
    {  // K over both axes: partial over both, one AllReduce over the two together.
      using A = gshard::Sharded<double, M, "I K:x*y">;
      using B = gshard::Sharded<double, M, "K:x*y J">;
      const auto p = run_einsum<"IK,KJ->IJ", A, B>(mesh, grid, expect);
      check_no_comm("IK,KJ->IJ, K on x*y in both" + where);
      check_spec(p, "I J +x +y", where);
      CHECK(check_block(p, grid, expect) == "");

      gshard::comm_counters().reset();
      const auto full = gshard::reshard<gshard::Sharded<double, M, "I J">>(p);
      const int k = kx * ky;
      check_comm({{"x*y", Collective::all_reduce, 2 * (k - 1) * S / k}}, {k},
                 "\"I J +x +y\" -> \"I J\"" + where);
      CHECK(check_block(full, grid, expect) == "");
    }
  }
}

TEST_CASE("einsum: contracting label split in one operand only slices the other locally") {
  for (const auto& s : two_axis_shapes(world_size())) {
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    const Grid grid = grid_of(s);
    const std::string where = " on " + mesh_text(s);
    std::vector<double> expect;
    {
      using A = gshard::Sharded<double, M, "I K:y">;
      using B = gshard::Sharded<double, M, "K J">;
      const auto p = run_einsum<"IK,KJ->IJ", A, B>(mesh, grid, expect);
      check_no_comm("IK,KJ->IJ, K on y in A only" + where);
      check_spec(p, "I J +y", where);
      CHECK(check_block(p, grid, expect) == "");
    }
    {
      using A = gshard::Sharded<double, M, "I K">;
      using B = gshard::Sharded<double, M, "K:x J">;
      const auto p = run_einsum<"IK,KJ->IJ", A, B>(mesh, grid, expect);
      check_no_comm("IK,KJ->IJ, K on x in B only" + where);
      check_spec(p, "I J +x", where);
      CHECK(check_block(p, grid, expect) == "");
    }
    {  // With the batch label split too, on the other axis.
      using A = gshard::Sharded<double, M, "B:x I K">;
      using B = gshard::Sharded<double, M, "B:x K:y J">;
      const auto p = run_einsum<"BIK,BKJ->BIJ", A, B>(mesh, grid, expect);
      check_no_comm("BIK,BKJ->BIJ, B on x in both, K on y in B only" + where);
      check_spec(p, "B:x I J +y", where);
      CHECK(check_block(p, grid, expect) == "");
    }
  }
}

namespace {

// The reshard of the second operand when its label `c` is split over axis b (size kb, this
// rank's coordinate cb) but the rules want axis a (size ka, coordinate ca), every other label
// unsplit; `rest` is the product of its other local extents, n the size of c. From GShard's table
// as the design describes it:
//   - same size: CollectivePermute over a*b; the partner has the a and b coordinates swapped, so
//     a rank whose two coordinates agree keeps its block (0 bytes), the others send all of it;
//   - otherwise: AllToAllv over a*b. A receiver gets each element from the holder that agrees
//     with it on a (which replicates the source): this rank serves the kb-1 ranks that differ
//     from it only on b, each needing the overlap of its a-block with our b-block.
// When one of the axes has size 1 the move is really a local slice (kb == 1) or an AllGather
// over b (ka == 1); the planner may spell it as an AllToAllv over a*b that moves the same bytes,
// so there only the bytes and "at most one call" are pinned (`exact` false).
struct Conflict {
  Expected expected;
  int group;
  bool exact;
};

Conflict conflict(const std::string& a_name, const std::string& b_name, int ka, int kb, int ca,
                  int cb, Int n, Int rest) {
  const std::string axes = a_name < b_name ? a_name + "*" + b_name : b_name + "*" + a_name;
  const Int chunk_b = n / kb;
  if (ka == kb)
    return {{axes, Collective::permute, ca == cb ? 0 : chunk_b * rest * elem}, ka * kb, true};
  const Int chunk_a = n / ka;
  const Int lo = std::max<Int>(ca * chunk_a, cb * chunk_b);
  const Int hi = std::min<Int>((ca + 1) * chunk_a, (cb + 1) * chunk_b);
  return {{axes, Collective::all_to_all_v, (kb - 1) * std::max<Int>(0, hi - lo) * rest * elem},
          ka * kb,
          ka > 1 && kb > 1};
}

void check_conflict(const Conflict& c, const std::string& what) {
  if (c.exact) {
    check_comm({c.expected}, {c.group}, what);
    return;
  }
  const gshard::CommCount t = gshard::comm_counters().total();
  INFO(what);
  INFO("expected " << c.expected.bytes << " bytes in at most one call; counted:"
                   << counters_text(gshard::comm_counters().all()));
  CHECK(t.bytes == c.expected.bytes);
  CHECK(t.calls <= 1);
}

}  // namespace

TEST_CASE("einsum: a label split on different axes reshards the second operand") {
  for (const auto& s : two_axis_shapes(world_size())) {
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    const Grid grid = grid_of(s);
    const std::string where = " on " + mesh_text(s);
    std::vector<double> expect;
    {  // Batch: B on x in A, on y in B. B is brought to "B:x K J".
      using A = gshard::Sharded<double, M, "B:x I K">;
      using B = gshard::Sharded<double, M, "B:y K J">;
      const auto r = run_einsum<"BIK,BKJ->BIJ", A, B>(mesh, grid, expect);
      check_conflict(conflict("x", "y", s[0], s[1], grid.coords[0], grid.coords[1], size_of('B'),
                              size_of('K') * size_of('J')),
                     "BIK,BKJ->BIJ, B on x in A and on y in B" + where);
      check_spec(r, "B:x I J", where);
      CHECK(check_block(r, grid, expect) == "");
    }
    {  // Contracting: K on y in A, on x in B. B is brought to "K:y J"; the result is partial.
      using A = gshard::Sharded<double, M, "I K:y">;
      using B = gshard::Sharded<double, M, "K:x J">;
      const auto r = run_einsum<"IK,KJ->IJ", A, B>(mesh, grid, expect);
      check_conflict(conflict("y", "x", s[1], s[0], grid.coords[1], grid.coords[0], size_of('K'),
                              size_of('J')),
                     "IK,KJ->IJ, K on y in A and on x in B" + where);
      check_spec(r, "I J +y", where);
      CHECK(check_block(r, grid, expect) == "");
    }
  }
  for (const auto& s : two_axis_shapes(world_size())) {
    // Two output labels on the same axis: I takes x first, so J (x in B) is replicated and B
    // gathers J over x: one AllGather of B's block, (kx-1) * S bytes.
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    const Grid grid = grid_of(s);
    const std::string where = " on " + mesh_text(s);
    std::vector<double> expect;
    using A = gshard::Sharded<double, M, "I:x K">;
    using B = gshard::Sharded<double, M, "K J:x">;
    const auto r = run_einsum<"IK,KJ->IJ", A, B>(mesh, grid, expect);
    const int kx = s[0];
    const Int S = size_of('K') * (size_of('J') / kx) * elem;
    check_comm({{"x", Collective::all_gather, (kx - 1) * S}}, {kx},
               "IK,KJ->IJ, I on x in A and J on x in B" + where);
    check_spec(r, "I:x J", where);
    CHECK(check_block(r, grid, expect) == "");
  }
  if (world_size() == 8) {  // two axes of size 2 next to a third: a CollectivePermute over x*y
    const std::vector<int> s{2, 2, 2};
    const M3 mesh(MPI_COMM_WORLD, {2, 2, 2});
    const Grid grid = grid_of(s);
    std::vector<double> expect;
    using A = gshard::Sharded<double, M3, "B:x I K:z">;
    using B = gshard::Sharded<double, M3, "B:y K:z J">;
    const auto r = run_einsum<"BIK,BKJ->BIJ", A, B>(mesh, grid, expect);
    check_conflict(conflict("x", "y", 2, 2, grid.coords[0], grid.coords[1], size_of('B'),
                            size_of('K') / 2 * size_of('J')),
                   "BIK,BKJ->BIJ, B on x in A and on y in B, K on z in both, mesh 2x2x2");
    check_spec(r, "B:x I J +z", "mesh 2x2x2");
    CHECK(check_block(r, grid, expect) == "");
  }
}

TEST_CASE("flop counters: each rank counts 2 m n k of its own (padded) block") {
  // I = 7 rows over x: blocks of ceil(7 / x) rows, padded alike on every rank (some hold only
  // padding on 8 ranks); J contracted, K kept. Then J split over y in both operands: each rank
  // multiplies its ceil(J / y) slice (the partial sums' AllReduce is communication, not FLOPs).
  for (const auto& s : two_axis_shapes(world_size())) {
    const M mesh(MPI_COMM_WORLD, {s[0], s[1]});
    INFO("mesh " << mesh_text(s));
    const Int I = 7, J = 5, K = 3;
    const Int rows = (I + s[0] - 1) / s[0], depth = (J + s[1] - 1) / s[1];
    auto& flops = gshard::flop_counters();
    {
      using A = gshard::Sharded<double, M, "I:x J">;
      using B = gshard::Sharded<double, M, "J K">;
      const auto a = gshard::full<A>(mesh, {I, J}, 1.0);
      const auto b = gshard::full<B>(mesh, {J, K}, 2.0);
      flops.reset();
      const auto c = gshard::einsum<"IJ,JK->IK">(a, b).eval();
      CHECK(flops.contraction() == 2 * rows * J * K);
      CHECK(c.to_global() == std::vector<double>(static_cast<std::size_t>(I * K), 2.0 * J));
    }
    {
      using A = gshard::Sharded<double, M, "I:x J:y">;
      using B = gshard::Sharded<double, M, "J:y K">;
      const auto a = gshard::full<A>(mesh, {I, J}, 1.0);
      const auto b = gshard::full<B>(mesh, {J, K}, 2.0);
      flops.reset();
      const auto c = gshard::einsum<"IJ,JK->IK">(a, b).eval();
      CHECK(flops.contraction() == 2 * rows * depth * K);
      CHECK(c.to_global() == std::vector<double>(static_cast<std::size_t>(I * K), 2.0 * J));
    }
  }
}
