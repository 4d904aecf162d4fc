// Resharding, one case per transition of GShard's table (even sizes): the collective it uses, on
// which axes, how many calls and how many bytes this rank sends (comm/counters.hpp:
// AllGather (k-1)*S, AllToAll (k-1)/k*S of the send payload, AllReduce 2(k-1)/k*S, ReduceScatter
// (k-1)/k*S of the input, CollectivePermute S or 0 when the partner is this rank, AllToAllv the
// bytes sent to others), with S derived here from the sizes; and the values, against our own
// block arithmetic over a global tensor.
//
// Meshes: Mesh<"x","y"> shaped to the rank count ({1,1}, {1,2}, {2,2}, {2,4}); the permute
// needs two axes of the same size, so it runs on Mesh<"a","b","c"> ({1,1,1}, {1,1,2}, {2,2,1},
// {2,2,2}). A collective over axes of size 1 moves nothing and the plan makes it a local step,
// so there the counters must stay empty.
#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "mpi_test.hpp"

namespace {

using gshard::Collective;
using gshard::Shape;
using gshard::StepKind;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;
using M = gshard::Mesh<"x", "y">;
using M3 = gshard::Mesh<"a", "b", "c">;

std::vector<int> mesh_sizes_2(int n) {
  switch (n) {
    case 1:
      return {1, 1};
    case 2:
      return {1, 2};
    case 4:
      return {2, 2};
    default:
      return {2, n / 2};
  }
}

std::vector<int> mesh_sizes_3(int n) {
  switch (n) {
    case 1:
      return {1, 1, 1};
    case 2:
      return {1, 1, 2};
    case 4:
      return {2, 2, 1};
    default:
      return {2, 2, n / 4};
  }
}

M make_mesh() {
  const auto s = mesh_sizes_2(world_size());
  return M(MPI_COMM_WORLD, {s[0], s[1]});
}

// --- our own geometry -------------------------------------------------------------------------

struct Grid {
  std::vector<int> sizes;
  std::vector<int> coords;
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

// A layout written out by hand: labels in memory order, the axes of each dimension (major
// first) and the partial axes.
struct Geo {
  std::string labels;
  std::vector<std::vector<int>> axes;
  std::vector<int> partial;
};

struct Local {
  std::vector<double> value;  // this rank's padded block (or its partial summand)
  std::vector<char> pad;
};

// This rank's block under `geo` of the global tensor `global` (row-major in `src_labels` order,
// of shape `shape` in that order). With `summands`, a partial layout gets this rank's share: a
// random integer for partial coordinates other than 0, the rest at 0.
Local block(const Geo& geo, const std::string& src_labels, const Shape& shape,
            const std::vector<double>& global, const Grid& grid, bool summands) {
  const std::size_t r = geo.labels.size();
  std::vector<Int> src_stride(r);
  Int s = 1;
  for (std::size_t d = r; d-- > 0;) {
    src_stride[d] = s;
    s *= shape[d];
  }
  std::vector<Int> chunk(r), offset(r), valid(r), stride(r);
  Int total = 1;
  for (std::size_t d = 0; d < r; ++d) {
    const std::size_t sd = src_labels.find(geo.labels[d]);
    const Int n = shape[sd];
    Int k = 1;
    Int index = 0;
    for (int a : geo.axes[d]) {
      const auto au = static_cast<std::size_t>(a);
      k *= grid.sizes[au];
      index = index * grid.sizes[au] + grid.coords[au];
    }
    chunk[d] = (n + k - 1) / k;
    offset[d] = index * chunk[d];
    valid[d] = std::max<Int>(0, std::min(n, offset[d] + chunk[d]) - offset[d]);
    stride[d] = src_stride[sd];
    total *= chunk[d];
  }
  int copies = 1;
  int q = 0;
  for (int a : geo.partial) {
    const auto au = static_cast<std::size_t>(a);
    copies *= grid.sizes[au];
    q = q * grid.sizes[au] + grid.coords[au];
  }
  Local out{std::vector<double>(static_cast<std::size_t>(total), 0.0),
            std::vector<char>(static_cast<std::size_t>(total), 0)};
  for (Int i = 0; i < total; ++i) {
    Int rest = i;
    Int g = 0;
    bool pad = false;
    for (std::size_t d = r; d-- > 0;) {
      const Int l = rest % chunk[d];
      rest /= chunk[d];
      if (l >= valid[d]) pad = true;
      g += (offset[d] + l) * stride[d];
    }
    const auto iu = static_cast<std::size_t>(i);
    out.pad[iu] = pad ? 1 : 0;
    if (pad) continue;
    double v = global[static_cast<std::size_t>(g)];
    if (summands && copies > 1) {
      auto part = [&](int j) { return static_cast<double>((g * 31 + j * 17) % 23) - 11.0; };
      if (q != 0) {
        v = part(q);
      } else {
        for (int j = 1; j < copies; ++j) v -= part(j);
      }
    }
    out.value[iu] = v;
  }
  return out;
}

// Integer-valued doubles, so every sum is exact.
std::vector<double> make_global(const Shape& shape) {
  Int n = 1;
  for (auto e : shape) n *= e;
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = static_cast<double>((i * 37 + 11) % 101) - 50.0;
  return g;
}

// The global tensor rewritten row-major in `to` label order.
std::vector<double> transposed(const std::vector<double>& global, const std::string& from,
                               const Shape& shape, const std::string& to) {
  const std::size_t r = from.size();
  std::vector<Int> src_stride(r);
  Int s = 1;
  for (std::size_t d = r; d-- > 0;) {
    src_stride[d] = s;
    s *= shape[d];
  }
  std::vector<double> out(global.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    Int rest = static_cast<Int>(i);
    Int g = 0;
    for (std::size_t d = r; d-- > 0;) {
      const std::size_t sd = from.find(to[d]);
      g += (rest % shape[sd]) * src_stride[sd];
      rest /= shape[sd];
    }
    out[i] = global[static_cast<std::size_t>(g)];
  }
  return out;
}

template <class V>
std::vector<typename V::non_const_value_type> host_copy(const V& view) {
  auto mirror = Kokkos::create_mirror_view(view);
  Kokkos::deep_copy(mirror, view);
  return {mirror.data(), mirror.data() + mirror.extent(0)};
}

template <class T>
Kokkos::View<T*> device_copy(const std::vector<double>& v) {
  Kokkos::View<T*> view("shard", v.size());
  auto mirror = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < v.size(); ++i) mirror(i) = static_cast<T>(v[i]);
  Kokkos::deep_copy(view, mirror);
  return view;
}

// One expected collective call: its axes (as the counters name them), kind and bytes.
struct Call {
  std::string axes;
  Collective kind;
  Int bytes;
};

unsigned mask_of(const std::vector<int>& axes) {
  unsigned m = 0;
  for (int a : axes) m |= 1u << a;
  return m;
}

// What a reshard did, collected by the per-type code so the checks compile once.
struct Outcome {
  std::vector<gshard::ReshardStep> steps;
  Int plan_bytes = 0;
  std::string explained;
  std::map<std::pair<std::string, Collective>, gshard::CommCount> counted;
  std::vector<double> local;   // the target shard
  std::vector<double> global;  // to_global() of the target
};

void check_outcome(const std::string& what, const Outcome& o, const std::vector<Call>& calls,
                   const std::vector<StepKind>& kinds, const Geo& to, const Local& expect,
                   const std::vector<double>& expect_global, MPI_Comm partial_group,
                   bool new_partial_zero) {
  INFO(what);
  INFO("plan on this rank:\n" << o.explained);
  // The plan: the steps of the table.
  std::vector<StepKind> planned;
  for (const auto& s : o.steps) planned.push_back(s.kind);
  CHECK(planned == kinds);
  Int total = 0;
  for (const auto& c : calls) total += c.bytes;
  CHECK(o.plan_bytes == total);
  // The counters: exactly these collectives, once each, with these bytes.
  CHECK(o.counted.size() == calls.size());
  for (const auto& c : calls) {
    INFO("expected " << gshard::collective_name(c.kind) << " over " << c.axes << ", " << c.bytes
                     << " bytes");
    const auto it = o.counted.find({c.axes, c.kind});
    REQUIRE(it != o.counted.end());
    CHECK(it->second.calls == 1);
    CHECK(it->second.bytes == c.bytes);
    CHECK(o.explained.find(gshard::collective_name(c.kind)) != std::string::npos);
  }
  // The values: padding zero on every copy; the shard (summed over partial copies) is the block.
  REQUIRE(o.local.size() == expect.value.size());
  bool pad_zero = true;
  for (std::size_t i = 0; i < o.local.size(); ++i)
    pad_zero = pad_zero && (!expect.pad[i] || o.local[i] == 0.0);
  CHECK(pad_zero);
  std::vector<double> summed = o.local;
  if (!to.partial.empty())
    MPI_Allreduce(MPI_IN_PLACE, summed.data(), static_cast<int>(summed.size()), MPI_DOUBLE, MPI_SUM,
                  partial_group);
  CHECK(summed == expect.value);
  if (new_partial_zero) {
    // Replicated -> partial: the copies away from coordinate 0 of the new partial axes are zeros.
    CHECK(o.local == std::vector<double>(o.local.size(), 0.0));
  }
  CHECK(o.global == expect_global);
}

// Reshards a Src tensor (our shard of `global`, split into summands when partial) to Dst and
// checks the plan, the counters and the values. `calls` and `kinds` are what the table says.
template <class Src, class Dst>
void transition(const typename Src::mesh_type& mesh, const std::vector<int>& sizes, const Geo& from,
                const Geo& to, const Shape& shape, const std::vector<Call>& calls,
                const std::vector<StepKind>& kinds) {
  using T = typename Src::value_type;
  const Grid grid = grid_of(sizes);
  const std::vector<double> global = make_global(shape);
  const Local src = block(from, from.labels, shape, global, grid, true);
  const Src x(mesh, shape, device_copy<T>(src.value));
  Outcome o;
  const gshard::ReshardPlan plan = gshard::plan_reshard<Dst>(x);
  o.steps = plan.steps;
  o.plan_bytes = plan.bytes();
  o.explained = gshard::explain(plan);
  gshard::comm_counters().reset();
  const Dst y = gshard::reshard<Dst>(x);
  o.counted = gshard::comm_counters().all();
  for (const auto v : host_copy(y.local_view())) o.local.push_back(static_cast<double>(v));
  for (const auto v : y.to_global()) o.global.push_back(static_cast<double>(v));
  // Copies at a nonzero coordinate of a partial axis the source did not have hold zeros.
  bool new_partial_zero = false;
  for (int a : to.partial) {
    const bool is_new =
        std::find(from.partial.begin(), from.partial.end(), a) == from.partial.end();
    if (is_new && grid.coords[static_cast<std::size_t>(a)] != 0) new_partial_zero = true;
  }
  std::string what = "\"" + std::string(Src::spec_string()) + "\" -> \"" +
                     std::string(Dst::spec_string()) + "\" on " + mesh.describe() + ", shape " +
                     gshard::detail::shape_string(shape) + ", element size " +
                     std::to_string(sizeof(T));
  check_outcome(what, o, calls, kinds, to, block(to, from.labels, shape, global, grid, false),
                transposed(global, from.labels, shape, to.labels), mesh.group(mask_of(to.partial)),
                new_partial_zero);
}

// The call list for one collective over axes of group size k: none when k == 1 (elided).
std::vector<Call> one_call(int k, const std::string& axes, Collective kind, Int bytes) {
  if (k == 1) return {};
  return {Call{axes, kind, bytes}};
}
std::vector<StepKind> one_step(int k, StepKind kind) { return {k == 1 ? StepKind::local : kind}; }

const Shape even_shape{8, 8, 3};  // G and S divide by every shard count here (at most 8)
constexpr Int D = sizeof(double);

}  // namespace

TEST_CASE("transition split -> replicated: AllGather, (k-1)*S") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  const int X = s[0];
  const int Y = s[1];
  {                                     // over y
    const Int S = (8 / Y) * 8 * 3 * D;  // this rank's block
    transition<gshard::Sharded<double, M, "G:y S M">, gshard::Sharded<double, M, "G S M">>(
        mesh, s, {"GSM", {{1}, {}, {}}, {}}, {"GSM", {{}, {}, {}}, {}}, even_shape,
        one_call(Y, "y", Collective::all_gather, (Y - 1) * S), one_step(Y, StepKind::all_gather));
  }
  {  // over x, float: bytes follow the element size
    const Int S = (8 / X) * 8 * 3 * Int{sizeof(float)};
    transition<gshard::Sharded<float, M, "G S:x M">, gshard::Sharded<float, M, "G S M">>(
        mesh, s, {"GSM", {{}, {0}, {}}, {}}, {"GSM", {{}, {}, {}}, {}}, even_shape,
        one_call(X, "x", Collective::all_gather, (X - 1) * S), one_step(X, StepKind::all_gather));
  }
  {  // the minor axis of a two-axis split: AllGather over y only
    const Int S = (8 / (X * Y)) * 8 * 3 * D;
    transition<gshard::Sharded<double, M, "G:x*y S M">, gshard::Sharded<double, M, "G:x S M">>(
        mesh, s, {"GSM", {{0, 1}, {}, {}}, {}}, {"GSM", {{0}, {}, {}}, {}}, even_shape,
        one_call(Y, "y", Collective::all_gather, (Y - 1) * S), one_step(Y, StepKind::all_gather));
  }
}

TEST_CASE("transition replicated -> split: a local slice, 0 bytes") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  transition<gshard::Sharded<double, M, "G S M">, gshard::Sharded<double, M, "G S:y M">>(
      mesh, s, {"GSM", {{}, {}, {}}, {}}, {"GSM", {{}, {1}, {}}, {}}, even_shape, {},
      {StepKind::local});
  transition<gshard::Sharded<double, M, "G:x S M">, gshard::Sharded<double, M, "G:x*y S M">>(
      mesh, s, {"GSM", {{0}, {}, {}}, {}}, {"GSM", {{0, 1}, {}, {}}, {}}, even_shape, {},
      {StepKind::local});
}

TEST_CASE("transition split dim X -> split dim Y on the same axis: AllToAll, (k-1)/k*S") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  const int X = s[0];
  const int Y = s[1];
  {
    // Send payload: the local block [8/Y, 8, 3] in k pieces of [8/Y, 8/Y, 3]: S = the block.
    const Int S = (8 / Y) * 8 * 3 * D;
    transition<gshard::Sharded<double, M, "G:y S M">, gshard::Sharded<double, M, "G S:y M">>(
        mesh, s, {"GSM", {{1}, {}, {}}, {}}, {"GSM", {{}, {1}, {}}, {}}, even_shape,
        one_call(Y, "y", Collective::all_to_all, (Y - 1) * S / Y),
        one_step(Y, StepKind::all_to_all));
  }
  {
    // x moves from M (size 2X) to G, with y splitting S throughout: the block [8, 8/Y, 2] goes
    // out in X pieces of [8/X, 8/Y, 2], so the send payload S is the block.
    const Int S = 8 * (8 / Y) * 2 * D;
    transition<gshard::Sharded<double, M, "G S:y M:x">, gshard::Sharded<double, M, "G:x S:y M">>(
        mesh, s, {"GSM", {{}, {1}, {0}}, {}}, {"GSM", {{0}, {1}, {}}, {}}, Shape{8, 8, 2 * X},
        one_call(X, "x", Collective::all_to_all, (X - 1) * S / X),
        one_step(X, StepKind::all_to_all));
  }
}

TEST_CASE("transition partial -> replicated: AllReduce, 2(k-1)/k*S") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  const int Y = s[1];
  const Int S = 8 * 8 * 3 * D;
  transition<gshard::Sharded<double, M, "G S M +y">, gshard::Sharded<double, M, "G S M">>(
      mesh, s, {"GSM", {{}, {}, {}}, {1}}, {"GSM", {{}, {}, {}}, {}}, even_shape,
      one_call(Y, "y", Collective::all_reduce, 2 * (Y - 1) * S / Y),
      one_step(Y, StepKind::all_reduce));
}

TEST_CASE("transition partial -> split: ReduceScatter, (k-1)/k*S of the input") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  const int Y = s[1];
  const Int S = 8 * 8 * 3 * D;  // the input: the whole (partial) tensor
  transition<gshard::Sharded<double, M, "G S M +y">, gshard::Sharded<double, M, "G:y S M">>(
      mesh, s, {"GSM", {{}, {}, {}}, {1}}, {"GSM", {{1}, {}, {}}, {}}, even_shape,
      one_call(Y, "y", Collective::reduce_scatter, (Y - 1) * S / Y),
      one_step(Y, StepKind::reduce_scatter));
  // Scattering an inner dimension (the pieces are not contiguous in the input).
  transition<gshard::Sharded<double, M, "G S M +y">, gshard::Sharded<double, M, "G S:y M">>(
      mesh, s, {"GSM", {{}, {}, {}}, {1}}, {"GSM", {{}, {1}, {}}, {}}, even_shape,
      one_call(Y, "y", Collective::reduce_scatter, (Y - 1) * S / Y),
      one_step(Y, StepKind::reduce_scatter));
}

TEST_CASE("transition split on axis a -> the same dim on axis b: CollectivePermute, S or 0") {
  const auto s = mesh_sizes_3(world_size());
  const M3 mesh(MPI_COMM_WORLD, {s[0], s[1], s[2]});
  const Grid grid = grid_of(s);
  const int k = s[0];  // == s[1]
  REQUIRE(s[0] == s[1]);
  const bool partner_is_me = grid.coords[0] == grid.coords[1];
  {
    const Int S = (8 / k) * 8 * 3 * D;
    transition<gshard::Sharded<double, M3, "G:a S M">, gshard::Sharded<double, M3, "G:b S M">>(
        mesh, s, {"GSM", {{0}, {}, {}}, {}}, {"GSM", {{1}, {}, {}}, {}}, even_shape,
        one_call(k, "a*b", Collective::permute, partner_is_me ? 0 : S),
        one_step(k, StepKind::permute));
  }
  {  // with c splitting another dimension throughout
    const Int S = (8 / k) * (8 / s[2]) * 3 * D;
    transition<gshard::Sharded<double, M3, "G:a S:c M">, gshard::Sharded<double, M3, "G:b S:c M">>(
        mesh, s, {"GSM", {{0}, {2}, {}}, {}}, {"GSM", {{1}, {2}, {}}, {}}, even_shape,
        one_call(k, "a*b", Collective::permute, partner_is_me ? 0 : S),
        one_step(k, StepKind::permute));
  }
}

TEST_CASE("transition replicated -> partial: local, 0 bytes, other copies zero") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  transition<gshard::Sharded<double, M, "G S M">, gshard::Sharded<double, M, "G S M +y">>(
      mesh, s, {"GSM", {{}, {}, {}}, {}}, {"GSM", {{}, {}, {}}, {1}}, even_shape, {},
      {StepKind::make_partial});
  transition<gshard::Sharded<double, M, "G:y S M">, gshard::Sharded<double, M, "G:y S M +x">>(
      mesh, s, {"GSM", {{1}, {}, {}}, {}}, {"GSM", {{1}, {}, {}}, {0}}, even_shape, {},
      {StepKind::make_partial});
}

TEST_CASE("transition label order only: a local transpose, 0 bytes") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  transition<gshard::Sharded<double, M, "G:x S:y M">, gshard::Sharded<double, M, "S:y M G:x">>(
      mesh, s, {"GSM", {{0}, {1}, {}}, {}}, {"SMG", {{1}, {}, {0}}, {}}, even_shape, {},
      {StepKind::local});
  transition<gshard::Sharded<double, M, "G S M +y">, gshard::Sharded<double, M, "M G S +y">>(
      mesh, s, {"GSM", {{}, {}, {}}, {1}}, {"MGS", {{}, {}, {}}, {1}}, even_shape, {},
      {StepKind::local});
}

TEST_CASE("transition over several axes at once") {
  const M mesh = make_mesh();
  const auto s = mesh_sizes_2(world_size());
  const Grid grid = grid_of(s);
  const int X = s[0];
  const int Y = s[1];
  const int K = X * Y;
  {  // partial over both axes -> replicated: one AllReduce over x*y
    const Int S = 8 * 8 * 3 * D;
    transition<gshard::Sharded<double, M, "G S M +x +y">, gshard::Sharded<double, M, "G S M">>(
        mesh, s, {"GSM", {{}, {}, {}}, {0, 1}}, {"GSM", {{}, {}, {}}, {}}, even_shape,
        one_call(K, "x*y", Collective::all_reduce, 2 * (K - 1) * S / K),
        one_step(K, StepKind::all_reduce));
  }
  {  // partial over both -> split over both: a ReduceScatter per axis, x first
    const Int in_x = 8 * 8 * 3 * D;        // input of the first
    const Int in_y = (8 / X) * 8 * 3 * D;  // input of the second
    std::vector<Call> calls;
    std::vector<StepKind> kinds;
    for (const auto& [k, name, in] : {std::tuple{X, "x", in_x}, std::tuple{Y, "y", in_y}}) {
      for (const auto& c : one_call(k, name, Collective::reduce_scatter, (k - 1) * in / k))
        calls.push_back(c);
      kinds.push_back(k == 1 ? StepKind::local : StepKind::reduce_scatter);
    }
    transition<gshard::Sharded<double, M, "G S M +x +y">, gshard::Sharded<double, M, "G:x S:y M">>(
        mesh, s, {"GSM", {{}, {}, {}}, {0, 1}}, {"GSM", {{0}, {1}, {}}, {}}, even_shape, calls,
        kinds);
  }
  {  // split over x*y -> replicated: every other rank needs this rank's whole block (AllToAllv)
    const Int S = (8 / K) * 8 * 3 * D;
    transition<gshard::Sharded<double, M, "G:x*y S M">, gshard::Sharded<double, M, "G S M">>(
        mesh, s, {"GSM", {{0, 1}, {}, {}}, {}}, {"GSM", {{}, {}, {}}, {}}, even_shape,
        one_call(K, "x*y", Collective::all_to_all_v, (K - 1) * S),
        one_step(K, StepKind::redistribute));
  }
  {  // the two axes trade dimensions: AllToAllv, bytes = what the others need of this block
    // This rank holds G block gx (of X) and S block gy (of Y); the rank at (x', y') needs
    // G block y' (of Y) and S block x' (of X).
    auto overlap = [](Int lo1, Int n1, Int lo2, Int n2) {
      return std::max<Int>(0, std::min(lo1 + n1, lo2 + n2) - std::max(lo1, lo2));
    };
    Int elements = 0;
    for (int xo = 0; xo < X; ++xo)
      for (int yo = 0; yo < Y; ++yo) {
        if (xo == grid.coords[0] && yo == grid.coords[1]) continue;
        elements += overlap(grid.coords[0] * (8 / X), 8 / X, yo * (8 / Y), 8 / Y) *
                    overlap(grid.coords[1] * (8 / Y), 8 / Y, xo * (8 / X), 8 / X) * 3;
      }
    transition<gshard::Sharded<double, M, "G:x S:y M">, gshard::Sharded<double, M, "G:y S:x M">>(
        mesh, s, {"GSM", {{0}, {1}, {}}, {}}, {"GSM", {{1}, {0}, {}}, {}}, even_shape,
        one_call(K, "x*y", Collective::all_to_all_v, elements * D),
        one_step(K, StepKind::redistribute));
  }
}
