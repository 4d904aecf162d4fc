// Windowed ops (ops/conv.hpp): conv and pooling with split, replicated, partial and uneven
// spatial labels, through the run-time engines (detail::conv_runtime, detail::pool_runtime) on
// random layouts and meshes against a naive single-rank loop over the global values; the bytes
// each rank sends checked against our own halo arithmetic; the issue's two acceptance cases
// (256x256 3x3 over 2x2, 7x7 over 8x1 with 2-row shards) with exact counters; typed cases; errors.
//
// Every rank draws the same cases (SPMD). Shards are built with the tests' own block arithmetic
// (block_reference.hpp); a partial operand gets random summands over its partial coordinates.
// Values are dyadic, so sums are exact up to the order of summation.
#include "mpi_test.hpp"

#include <gshard/ops/conv.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

namespace gs = gshard;
using gs::Layout;
using gs::Shape;
using gs::test::block1;
using gs::test::device_copy;
using gs::test::Dice;
using gs::test::find_label;
using gs::test::for_block;
using gs::test::Grid;
using gs::test::grid_of;
using gs::test::host_copy;
using gs::test::layout_text;
using gs::test::list_text;
using gs::test::random_global;
using gs::test::random_layout;
using gs::test::shard_of;
using gs::test::world_rank;
using gs::test::world_size;
using Int = std::int64_t;

// --- the naive reference ------------------------------------------------------------------------

struct Global {
  std::string labels;  // memory order
  Shape shape;
  std::vector<double> v;
};

struct Reference {
  Global out;
  std::vector<double> mag;  // sum of |terms|, the scale of the tolerance
};

// One sliding label: input size, window, stride, dilation, zeros before, output size.
struct Win {
  char label, kernel;
  Int n, k, stride, dil, pad, n_out;
};

// Odometer over a shape: every index vector in row-major order.
bool advance(std::vector<Int>& idx, const Shape& shape) {
  for (std::size_t d = idx.size(); d-- > 0;) {
    if (++idx[d] < shape[d]) return true;
    idx[d] = 0;
  }
  return false;
}

Int flat_of(const std::vector<Int>& idx, const Shape& shape) {
  Int f = 0;
  for (std::size_t d = 0; d < idx.size(); ++d) f = f * shape[d] + idx[d];
  return f;
}

bool any_empty(const Shape& s) {
  return std::any_of(s.begin(), s.end(), [](Int v) { return v == 0; });
}

// conv: out[.., o, .., p] = sum_{c, k} x[.., c, .., p*s + k*d - pad] w[o, c, k] (zeros outside).
// The output has x's labels in x's order, the channel C replaced by O.
Reference naive_conv(const Global& x, const Global& w, const std::vector<Win>& wins, char c_label,
                     char o_label) {
  Reference r;
  r.out.labels = x.labels;
  r.out.shape = x.shape;
  const std::size_t xc = x.labels.find(c_label);
  r.out.labels[xc] = o_label;
  r.out.shape[xc] = w.shape[w.labels.find(o_label)];
  std::vector<int> win_of(x.labels.size(), -1);  // x dim -> window, or -1
  for (std::size_t i = 0; i < wins.size(); ++i) {
    const std::size_t d = x.labels.find(wins[i].label);
    win_of[d] = static_cast<int>(i);
    r.out.shape[d] = wins[i].n_out;
  }
  Shape inner{x.shape[xc]};  // c, then one offset per window
  for (const Win& win : wins) inner.push_back(win.k);
  if (any_empty(r.out.shape)) return r;
  std::vector<Int> o(r.out.shape.size(), 0), xi(x.shape.size()), wi(w.shape.size());
  do {
    double v = 0, m = 0;
    std::vector<Int> s(inner.size(), 0);
    if (!any_empty(inner)) do {
        bool inside = true;
        for (std::size_t d = 0; d < xi.size(); ++d) {
          if (d == xc) {
            xi[d] = s[0];
          } else if (win_of[d] >= 0) {
            const Win& win = wins[static_cast<std::size_t>(win_of[d])];
            xi[d] =
                o[d] * win.stride + s[static_cast<std::size_t>(win_of[d]) + 1] * win.dil - win.pad;
            inside = inside && xi[d] >= 0 && xi[d] < win.n;
          } else {
            xi[d] = o[d];
          }
        }
        if (!inside) continue;
        for (std::size_t d = 0; d < wi.size(); ++d) {
          const char l = w.labels[d];
          if (l == o_label) wi[d] = o[xc];
          if (l == c_label) wi[d] = s[0];
          for (std::size_t i = 0; i < wins.size(); ++i)
            if (l == wins[i].kernel) wi[d] = s[i + 1];
        }
        const double t = x.v[static_cast<std::size_t>(flat_of(xi, x.shape))] *
                         w.v[static_cast<std::size_t>(flat_of(wi, w.shape))];
        v += t;
        m += std::abs(t);
      } while (advance(s, inner));
    r.out.v.push_back(v);
    r.mag.push_back(m);
  } while (advance(o, r.out.shape));
  return r;
}

Reference naive_pool(const Global& x, const std::vector<Win>& wins, bool is_max) {
  Reference r{x, {}};
  r.out.v.clear();
  std::vector<int> win_of(x.labels.size(), -1);
  Shape inner;
  for (std::size_t i = 0; i < wins.size(); ++i) {
    const std::size_t d = x.labels.find(wins[i].label);
    win_of[d] = static_cast<int>(i);
    r.out.shape[d] = wins[i].n_out;
    inner.push_back(wins[i].k);
  }
  if (any_empty(r.out.shape)) return r;
  std::vector<Int> o(r.out.shape.size(), 0), xi(x.shape.size());
  Int count = 1;
  for (Int k : inner) count *= k;
  do {
    double v = 0, m = 0;
    bool first = true;
    std::vector<Int> s(inner.size(), 0);
    do {
      for (std::size_t d = 0; d < xi.size(); ++d) {
        const int i = win_of[d];
        xi[d] = i < 0 ? o[d]
                      : o[d] * wins[static_cast<std::size_t>(i)].stride +
                            s[static_cast<std::size_t>(i)];
      }
      const double t = x.v[static_cast<std::size_t>(flat_of(xi, x.shape))];
      v = first ? t : is_max ? std::max(v, t) : v + t;
      m += std::abs(t);
      first = false;
    } while (advance(s, inner));
    if (!is_max) {
      v /= static_cast<double>(count);
      m /= static_cast<double>(count);
    }
    r.out.v.push_back(v);
    r.mag.push_back(std::max(m, std::abs(v)));
  } while (advance(o, r.out.shape));
  return r;
}

// --- our own halo arithmetic --------------------------------------------------------------------

struct Span {
  Int lo, hi;
  [[nodiscard]] Int size() const { return std::max<Int>(0, hi - lo); }
};

Span meet(Span a, Span b) { return {std::max(a.lo, b.lo), std::min(a.hi, b.hi)}; }

// Rows of the input that output block j (of k) reads.
Span needed(const Win& w, Int j, Int k) {
  const Int co = (w.n_out + k - 1) / k;
  const Int first = j * co, last = std::min(w.n_out, (j + 1) * co) - 1;
  if (last < first) return {0, 0};
  const Span s{std::max<Int>(0, first * w.stride - w.pad),
               std::min(w.n, last * w.stride - w.pad + w.dil * (w.k - 1) + 1)};
  return s.size() > 0 ? s : Span{0, 0};
}

Span held_rows(const Win& w, Int j, Int k) {
  const Int c = (w.n + k - 1) / k;
  return {j * c, std::min(w.n, (j + 1) * c)};
}

// Bytes this rank sends in the halo exchange: per window in order, the rows of its block each
// other block needs, times the valid extent of every other dimension (windows done so far: the
// rows this rank needs).
Int halo_bytes(const Layout& l, const Shape& shape, const std::vector<Win>& wins, const Grid& grid,
               Int elem) {
  std::vector<Int> extent;
  for (int d = 0; d < l.rank; ++d)
    extent.push_back(block1(shape[static_cast<std::size_t>(d)], l.dims[d].axes.data(),
                            l.dims[d].axis_count, grid)
                         .valid);
  Int bytes = 0;
  for (const Win& w : wins) {
    const int d = find_label(l, w.label);
    Int k = 1, me = 0;
    for (int i = 0; i < l.dims[d].axis_count; ++i) {
      const auto a = static_cast<std::size_t>(l.dims[d].axes[static_cast<std::size_t>(i)]);
      k *= grid.sizes[a];
      me = me * grid.sizes[a] + grid.coords[a];
    }
    Int others = 1;
    for (int e = 0; e < l.rank; ++e)
      if (e != d) others *= extent[static_cast<std::size_t>(e)];
    for (Int j = 0; j < k; ++j)
      if (j != me) bytes += meet(needed(w, j, k), held_rows(w, me, k)).size() * others * elem;
    extent[static_cast<std::size_t>(d)] = needed(w, me, k).size();
  }
  return bytes;
}

// --- checking a result --------------------------------------------------------------------------

// Padding zero on every copy, then (summed over the partial axes) each element against the
// reference.
std::string check_values(const std::vector<double>& got, const Layout& l, const Reference& ref,
                         const Grid& grid, const gs::detail::MeshState& mesh) {
  std::vector<Int> global_of;
  const Int total = for_block(l, ref.out.shape, grid, [&](Int, Int g) { global_of.push_back(g); });
  int ok = static_cast<Int>(got.size()) == total ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (ok == 0)
    return "local size " + std::to_string(got.size()) + ", expected " + std::to_string(total) +
           " (on some rank)";
  std::vector<double> sum;
  std::string wrong =
      gs::test::sum_partial_copies(got, l, ref.out.shape, grid, mesh, global_of, sum);
  for (std::size_t i = 0; i < sum.size() && wrong.empty(); ++i) {
    if (global_of[i] < 0) continue;
    const auto g = static_cast<std::size_t>(global_of[i]);
    if (!(std::abs(sum[i] - ref.out.v[g]) <= 1e-12 * ref.mag[g])) {
      std::ostringstream s;
      s.precision(17);
      s << "local element " << i << " (global " << g << ") is " << sum[i] << ", expected "
        << ref.out.v[g];
      wrong = s.str();
    }
  }
  return wrong;
}

// --- random cases -------------------------------------------------------------------------------

struct Case {
  bool pool = false, is_max = false;
  gs::ConvSpec spec;
  gs::ConvOptions copt;
  gs::PoolOptions popt;
  std::vector<Win> wins;
  std::string xl, wl;  // memory order
  Shape xs, ws;
  Layout xlay, wlay;
  std::uint64_t salt = 0;
};

Case random_case(Dice& dice, int axis_count, std::uint64_t salt) {
  std::string pool = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  dice.shuffle(pool);
  std::size_t next = 0;
  Case c;
  c.salt = salt;
  c.pool = dice.chance(30);
  c.is_max = dice.chance(50);
  const int ns = dice.chance(10) ? 3 : dice.chance(55) ? 2 : 1;
  c.spec.spatial_count = ns;
  std::map<char, Int> size;
  for (int s = 0; s < ns; ++s) {
    const auto si = static_cast<std::size_t>(s);
    Win w{pool[next++], pool[next++], 0, 0, 1, 1, 0, 0};
    c.spec.spatial[si] = w.label;
    c.spec.kernel[si] = w.kernel;
    // Sizes 1..14, often below the shard count (empty trailing blocks).
    w.n = dice.chance(30) ? dice.between(1, 4) : dice.between(1, ns == 1 ? 24 : ns == 2 ? 14 : 7);
    if (c.pool) {
      w.k = dice.between(1, std::min<int>(4, static_cast<int>(w.n)));
      w.stride = dice.chance(50) ? w.k : dice.between(1, 3);
      c.popt.window[si] = static_cast<int>(w.k);
      c.popt.stride[si] = w.stride == w.k && dice.chance(50) ? 0 : static_cast<int>(w.stride);
    } else {
      w.k = dice.between(1, ns == 3 ? 4 : 7);
      w.dil = dice.chance(25) ? 2 : 1;
      const bool same = dice.chance(50);
      c.copt.padding = s == 0 ? (same ? gs::Padding::same : gs::Padding::valid) : c.copt.padding;
      w.stride = c.copt.padding == gs::Padding::same ? 1 : dice.between(1, 3);
      c.copt.stride[si] = static_cast<int>(w.stride);
      c.copt.dilation[si] = static_cast<int>(w.dil);
    }
    const Int span = w.dil * (w.k - 1) + 1;
    if (!c.pool && c.copt.padding == gs::Padding::same) {
      w.pad = (span - 1) / 2;
      w.n_out = w.n;
    } else {
      if (w.n < span) w.n = span + dice.between(0, 3);
      w.n_out = (w.n - span) / w.stride + 1;
    }
    c.wins.push_back(w);
    size[w.label] = w.n;
    size[w.kernel] = w.k;
  }
  const int batch = dice.between(0, ns == 1 ? 2 : 1);
  std::string xl;
  for (const Win& w : c.wins) xl += w.label;
  for (int b = 0; b < batch; ++b) {
    const char l = pool[next++];
    size[l] = dice.between(1, 3);
    xl += l;
  }
  if (!c.pool) {
    c.spec.in_channel = pool[next++];
    c.spec.out_channel = pool[next++];
    size[c.spec.in_channel] = dice.between(1, 3);
    size[c.spec.out_channel] = dice.between(1, 3);
    xl += c.spec.in_channel;
    c.wl = std::string(1, c.spec.in_channel) + c.spec.out_channel;
    for (const Win& w : c.wins) c.wl += w.kernel;
    dice.shuffle(c.wl);
  }
  dice.shuffle(xl);
  c.xl = xl;
  for (char l : c.xl) c.xs.push_back(size[l]);
  for (char l : c.wl) c.ws.push_back(size[l]);
  c.xlay = random_layout(dice, c.xl, axis_count, {});
  if (!c.pool) {
    std::map<char, std::vector<int>> fixed;
    const int d = find_label(c.xlay, c.spec.in_channel);
    if (dice.chance(40)) {  // often C already agrees: no weight movement
      std::vector<int> axes;
      for (int i = 0; i < c.xlay.dims[d].axis_count; ++i)
        axes.push_back(c.xlay.dims[d].axes[static_cast<std::size_t>(i)]);
      fixed[c.spec.in_channel] = axes;
    }
    c.wlay = random_layout(dice, c.wl, axis_count, fixed);
  }
  return c;
}

std::string describe(const Case& c, const std::vector<int>& sizes,
                     const std::vector<std::string>& names, int index) {
  std::ostringstream s;
  s << "case #" << index << ": mesh";
  for (int v : sizes) s << ' ' << v;
  if (c.pool) {
    s << (c.is_max ? " max_pool" : " avg_pool") << " over";
  } else {
    s << " conv " << (c.copt.padding == gs::Padding::same ? "same" : "valid") << " over";
  }
  for (const Win& w : c.wins)
    s << ' ' << w.label << '(' << w.n << ") k " << w.k << " s " << w.stride << " d " << w.dil;
  s << ", x \"" << layout_text(c.xlay, names) << "\" " << list_text(c.xs);
  if (!c.pool) s << ", w \"" << layout_text(c.wlay, names) << "\" " << list_text(c.ws);
  s << ", salt " << c.salt;
  return s.str();
}

std::string run_case(const Case& c, const gs::detail::MeshState& mesh,
                     const std::vector<std::string>& names, const Grid& grid) {
  using RT = gs::detail::RuntimeTensor<double>;
  const Global gx{c.xl, c.xs, random_global(gs::detail::product(c.xs), c.salt, 0, false)};
  const RT x{c.xlay, c.xs, device_copy(shard_of<double>(c.xlay, c.xs, gx.v, grid, c.salt, false)),
             gs::ReduceOp::sum};
  Global gw;
  RT w;
  Int planned = 0;  // the reshards the op may do besides the halo exchange
  Layout expect = c.xlay, halo_layout = c.xlay;  // the halo moves the input in this layout
  if (c.pool) {
    if (c.is_max) {
      expect.partial_count = 0;
      planned =
          gs::detail::plan_reshard(c.xlay, expect, c.xs, mesh.sizes, mesh.coords, names, 8).bytes();
    }
  } else {
    gw = {c.wl, c.ws, random_global(gs::detail::product(c.ws), c.salt, 1, false)};
    w = RT{c.wlay, c.ws,
           device_copy(shard_of<double>(c.wlay, c.ws, gw.v, grid, c.salt ^ 0x5555, false)),
           gs::ReduceOp::sum};
    const gs::ConvLayouts rules = gs::infer_conv(c.spec, c.xlay, c.wlay);
    planned =
        gs::detail::plan_reshard(c.wlay, rules.weights, c.ws, mesh.sizes, mesh.coords, names, 8)
            .bytes();
    expect = rules.output;
    halo_layout = rules.input;
  }
  if (c.pool) halo_layout = expect;
  const Int halo = halo_bytes(halo_layout, c.xs, c.wins, grid, 8);
  const Int reshards = planned;
  planned += halo;
  gs::comm_counters().reset();
  RT r;
  std::string threw;
  try {
    r = c.pool ? gs::detail::pool_runtime<double>(
                     "pool", c.is_max ? gs::detail::PoolKind::max : gs::detail::PoolKind::avg,
                     c.spec, c.popt, mesh, names, x)
               : gs::detail::conv_runtime<double>("conv", c.spec, c.copt, mesh, names, x, w);
  } catch (const std::exception& e) {
    threw = e.what();
  }
  if (const std::string thrown = gs::test::threw_anywhere(threw); !thrown.empty()) return thrown;
  const Reference ref = c.pool ? naive_pool(gx, c.wins, c.is_max)
                               : naive_conv(gx, gw, c.wins, c.spec.in_channel, c.spec.out_channel);
  std::string wrong;
  // The rule, checked by its documented consequences: every label but the channel keeps the
  // input's axes, the output channel replaces the input channel in place, the input's pending
  // sums stay pending (except under max pooling).
  for (int d = 0; d < c.xlay.rank && wrong.empty(); ++d) {
    const bool channel = !c.pool && c.xlay.dims[d].label == c.spec.in_channel;
    if (r.layout.dims[d].label != (channel ? c.spec.out_channel : c.xlay.dims[d].label) ||
        (!channel && !(r.layout.dims[d] == c.xlay.dims[d])))
      wrong = "result layout \"" + layout_text(r.layout, names) + "\" breaks the rule";
  }
  for (int i = 0; i < c.xlay.partial_count && wrong.empty(); ++i)
    if (!(c.pool && c.is_max) && !r.layout.is_partial(c.xlay.partial[static_cast<std::size_t>(i)]))
      wrong = "result layout \"" + layout_text(r.layout, names) + "\" lost a pending sum";
  if (wrong.empty() && !(r.layout == expect))
    wrong = "result layout \"" + layout_text(r.layout, names) + "\", infer_conv says \"" +
            layout_text(expect, names) + "\"";
  if (wrong.empty() && r.shape != ref.out.shape)
    wrong = "result shape " + list_text(r.shape) + ", expected " + list_text(ref.out.shape);
  const gs::CommCount counted = gs::comm_counters().total();
  if (wrong.empty() && counted.bytes != planned) {
    wrong = "sent " + std::to_string(counted.bytes) + " bytes, expected " +
            std::to_string(reshards) + " (reshards) + " + std::to_string(halo) + " (halo rows):";
    for (const auto& [key, n] : gs::comm_counters().all())
      wrong += " " + key.first + "/" + gs::collective_name(key.second) + " " +
               std::to_string(n.calls) + " calls " + std::to_string(n.bytes) + " bytes";
  }
  int usable = r.layout == expect && r.shape == ref.out.shape ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (usable != 0) {
    const std::string v = check_values(host_copy(r.data), r.layout, ref, grid, mesh);
    if (wrong.empty()) wrong = v;
  }
  return wrong;
}

}  // namespace

TEST_CASE("conv and pooling (run-time engines): random layouts, sizes and meshes vs a naive loop") {
  const int n = world_size();
  const gs::test::TestMeshes test_meshes(n);
  const std::vector<gs::test::MeshUnderTest>& meshes = test_meshes.all;
  constexpr int total_cases = 600;
  const int per_mesh =
      (total_cases + static_cast<int>(meshes.size()) - 1) / static_cast<int>(meshes.size());
  Dice dice(20261202);
  int cases = 0, failures = 0, pools = 0, split_windows = 0, wide_halo = 0, partial_in = 0;
  int uneven = 0, empty_block = 0, split_channel = 0;
  for (const auto& m : meshes) {
    const Grid grid = grid_of(m.sizes, world_rank());
    for (int i = 0; i < per_mesh; ++i) {
      const Case c = random_case(dice, static_cast<int>(m.sizes.size()),
                                 static_cast<std::uint64_t>(cases) + 1);
      pools += c.pool ? 1 : 0;
      if (!c.pool)
        split_channel +=
            gs::infer_conv(c.spec, c.xlay, c.wlay).output.partial_count > c.xlay.partial_count;
      partial_in += c.xlay.partial_count > 0 ? 1 : 0;
      for (const Win& w : c.wins) {
        const int d = find_label(c.xlay, w.label);
        Int k = 1;
        for (int a = 0; a < c.xlay.dims[d].axis_count; ++a)
          k *= m.sizes[static_cast<std::size_t>(c.xlay.dims[d].axes[static_cast<std::size_t>(a)])];
        if (k > 1) ++split_windows;
        if (k > 1 && w.n % k != 0) ++uneven;
        if (k > 1 && (w.n + k - 1) / k * (k - 1) >= w.n) ++empty_block;
        if (k > 1 && w.dil * (w.k - 1) > (w.n + k - 1) / k) ++wide_halo;
      }
      const std::string wrong = run_case(c, *m.state, m.names, grid);
      if (!wrong.empty() && failures++ < 8)
        FAIL_CHECK(describe(c, m.sizes, m.names, cases)
                   << " at " << n << " ranks, rank " << world_rank() << ": " << wrong);
      ++cases;
    }
  }
  if (world_rank() == 0)
    MESSAGE(cases << " random cases over " << meshes.size() << " meshes: " << pools << " poolings, "
                  << split_windows << " split windows (" << wide_halo
                  << " with halos wider than a shard, " << uneven << " uneven, " << empty_block
                  << " with an empty last block), " << partial_in << " partial inputs, "
                  << split_channel << " contracting a split channel");
  CHECK(cases >= 100);
  CHECK(failures == 0);
}

// --- the acceptance cases, typed ----------------------------------------------------------------

namespace {

template <class S>
S make_operand(const typename S::mesh_type& mesh, const Grid& grid, const std::string& labels,
               const Shape& shape, std::uint64_t salt, Global& g) {
  g = {labels, shape, random_global(gs::detail::product(shape), salt, 0, false)};
  return S(mesh, shape, device_copy(shard_of<double>(S::layout, shape, g.v, grid, salt, false)));
}

template <class R>
std::string compare_global(const R& r, const Reference& ref) {
  if (r.shape() != ref.out.shape) return "shape " + list_text(r.shape());
  const std::vector<double> got = r.to_global();
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - ref.out.v[i]) <= 1e-12 * ref.mag[i]))
      return "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
             std::to_string(ref.out.v[i]);
  return "";
}

}  // namespace

TEST_CASE("conv2d: 256x256 image, 3x3 kernel, H and W split over a 2x2 mesh: only halo bytes") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  std::optional<Reference> ref;  // the same global operands on every mesh
  for (int a = 1; a <= n; ++a) {
    if (n % a != 0) continue;
    const M mesh(MPI_COMM_WORLD, {a, n / a});
    const Grid grid = grid_of({a, n / a}, world_rank());
    using X = gs::Sharded<double, M, "B C H:x W:y">;
    using W = gs::Sharded<double, M, "O C K L">;
    Global gx, gw;
    const X x = make_operand<X>(mesh, grid, "BCHW", {1, 2, 256, 256}, 7, gx);
    const W w = make_operand<W>(mesh, grid, "OCKL", {2, 2, 3, 3}, 8, gw);
    gs::comm_counters().reset();
    const auto r = gs::conv2d<"H:K W:L C->O">(x, w, {.padding = gs::Padding::same});
    const gs::CommCount rows = gs::comm_counters().get("x", gs::Collective::permute);
    const gs::CommCount cols = gs::comm_counters().get("y", gs::Collective::permute);
    const gs::CommCount all = gs::comm_counters().total();
    static_assert(decltype(r)::spec == gs::fixed_string("B O H:x W:y"));
    const std::vector<Win> wins{{'H', 'K', 256, 3, 1, 1, 1, 256}, {'W', 'L', 256, 3, 1, 1, 1, 256}};
    INFO("mesh " << a << "x" << n / a << ", rank " << world_rank());
    // Rows first (the local W block wide, valid part only), then columns of the widened block.
    CHECK(all.bytes == halo_bytes(X::layout, {1, 2, 256, 256}, wins, grid, 8));
    CHECK(all.calls == (a > 1 ? 2 : 0) + (n / a > 1 ? 2 : 0));
    if (a == 2 && n / a == 2) {
      CHECK(rows.calls == 2);  // one hop each way; the edge side sends to MPI_PROC_NULL
      CHECK(rows.bytes == 1 * 2 * 128 * 8);  // one row of 128 columns, 2 channels
      CHECK(cols.calls == 2);
      CHECK(cols.bytes == 1 * 2 * 129 * 8);  // one column of the 129 rows held now
    }
    if (!ref) ref = naive_conv(gx, gw, wins, 'C', 'O');
    CHECK(compare_global(r, *ref) == "");
  }
}

TEST_CASE("conv2d: 7x7 kernel over an 8x1 mesh with 2-row shards (halo wider than a shard)") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  const Grid grid = grid_of({n, 1}, world_rank());
  using X = gs::Sharded<double, M, "B C H:x W">;
  using W = gs::Sharded<double, M, "O C K L">;
  const Int h = 2 * n;  // 2-row shards at every rank count; 16 at 8 ranks
  Global gx, gw;
  const X x = make_operand<X>(mesh, grid, "BCHW", {2, 1, h, 9}, 11, gx);
  const W w = make_operand<W>(mesh, grid, "OCKL", {3, 1, 7, 7}, 12, gw);
  gs::comm_counters().reset();
  const auto r = gs::conv2d<"H:K W:L C->O">(x, w, {.padding = gs::Padding::same});
  const gs::CommCount c = gs::comm_counters().get("x", gs::Collective::permute);
  const std::vector<Win> wins{{'H', 'K', h, 7, 1, 1, 3, h}, {'W', 'L', 9, 7, 1, 1, 3, 9}};
  CHECK(c.bytes == halo_bytes(X::layout, {2, 1, h, 9}, wins, grid, 8));
  CHECK(gs::comm_counters().total().bytes == c.bytes);
  if (n == 8) {
    CHECK(c.calls == 4);  // hops -2, -1, +1, +2
    const int me = world_rank();
    // Rows sent: 2 to each neighbour and 1 to each second neighbour that exists.
    const Int rows = (me > 0 ? 2 : 0) + (me < 7 ? 2 : 0) + (me > 1 ? 1 : 0) + (me < 6 ? 1 : 0);
    CHECK(c.bytes == rows * 2 * 9 * 8);
  }
  CHECK(compare_global(r, naive_conv(gx, gw, wins, 'C', 'O')) == "");
}

TEST_CASE("conv1d, conv2d, max_pool, avg_pool: typed results follow the layout rules") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  int cases = 0;
  for (int a = 1; a <= n; ++a) {
    if (n % a != 0) continue;
    const M mesh(MPI_COMM_WORLD, {a, n / a});
    const Grid grid = grid_of({a, n / a}, world_rank());
    INFO("mesh " << a << "x" << n / a);
    Global gx, gw;
    {  // batch and W split, weights whole: no weight movement, halo over y only.
      using X = gs::Sharded<double, M, "B:x C H W:y">;
      using W = gs::Sharded<double, M, "O C K L">;
      const X x = make_operand<X>(mesh, grid, "BCHW", {3, 2, 6, 11}, 21, gx);
      const W w = make_operand<W>(mesh, grid, "OCKL", {2, 2, 2, 3}, 22, gw);
      const auto r = gs::conv2d<"H:K W:L C->O">(x, w);
      static_assert(decltype(r)::spec == gs::fixed_string("B:x O H W:y"));
      const std::vector<Win> wins{{'H', 'K', 6, 2, 1, 1, 0, 5}, {'W', 'L', 11, 3, 1, 1, 0, 9}};
      CHECK(compare_global(r, naive_conv(gx, gw, wins, 'C', 'O')) == "");
      ++cases;
    }
    {  // C split the same way in both: the result is partial over y.
      using X = gs::Sharded<double, M, "B C:y H:x W">;
      using W = gs::Sharded<double, M, "O C:y K L">;
      const X x = make_operand<X>(mesh, grid, "BCHW", {1, 5, 7, 5}, 23, gx);
      const W w = make_operand<W>(mesh, grid, "OCKL", {2, 5, 3, 3}, 24, gw);
      const auto r = gs::conv2d<"H:K W:L C->O">(
          x, w, {.padding = gs::Padding::valid, .stride = {2, 1, 1}, .dilation = {1, 2, 1}});
      static_assert(decltype(r)::spec == gs::fixed_string("B O H:x W +y"));
      const std::vector<Win> wins{{'H', 'K', 7, 3, 2, 1, 0, 3}, {'W', 'L', 5, 3, 1, 2, 0, 1}};
      CHECK(compare_global(r, naive_conv(gx, gw, wins, 'C', 'O')) == "");
      ++cases;
    }
    {  // conv1d, O split in the weights: the result keeps it; labels in other orders.
      using X = gs::Sharded<double, M, "T:x C">;
      using W = gs::Sharded<double, M, "K C O:y">;
      const X x = make_operand<X>(mesh, grid, "TC", {13, 3}, 25, gx);
      const W w = make_operand<W>(mesh, grid, "KCO", {4, 3, 5}, 26, gw);
      const auto r = gs::conv1d<"T:K C->O">(x, w, {.padding = gs::Padding::same});
      static_assert(decltype(r)::spec == gs::fixed_string("T:x O:y"));
      const std::vector<Win> wins{{'T', 'K', 13, 4, 1, 1, 1, 13}};
      const Reference ref = naive_conv(gx, gw, wins, 'C', 'O');
      CHECK(compare_global(r, ref) == "");
      // A lazy input (an elementwise expression) is evaluated and convolved the same way.
      const auto r2 = gs::conv1d<"T:K C->O">(x + x, w, {.padding = gs::Padding::same});
      Reference twice = ref;
      for (double& v : twice.out.v) v *= 2;
      for (double& m : twice.mag) m *= 2;
      CHECK(compare_global(r2, twice) == "");
      cases += 2;
    }
    {  // Pooling a partial input: max finishes the sum first, avg keeps it pending.
      using X = gs::Sharded<double, M, "H:x W +y">;
      const X x = make_operand<X>(mesh, grid, "HW", {9, 8}, 27, gx);
      const auto mx = gs::max_pool<"HW">(x, {.window = {2, 3}});
      const auto av = gs::avg_pool<"HW">(x, {.window = {3, 2}, .stride = {2, 1}});
      static_assert(decltype(mx)::spec == gs::fixed_string("H:x W"));
      static_assert(decltype(av)::spec == gs::fixed_string("H:x W +y"));
      CHECK(compare_global(
                mx, naive_pool(gx, {{'H', 'a', 9, 2, 2, 1, 0, 4}, {'W', 'b', 8, 3, 3, 1, 0, 2}},
                               true)) == "");
      CHECK(compare_global(
                av, naive_pool(gx, {{'H', 'a', 9, 3, 2, 1, 0, 4}, {'W', 'b', 8, 2, 1, 1, 0, 7}},
                               false)) == "");
      cases += 2;
    }
  }
  CHECK(cases >= 5);
}

TEST_CASE("conv and pooling errors name the op, the label, the shapes and layouts, on every rank") {
  using M = gs::Mesh<"x", "y">;
  const int n = world_size();
  const M mesh(MPI_COMM_WORLD, {n, 1});
  using X = gs::Sharded<double, M, "B C H:x W">;
  using W = gs::Sharded<double, M, "O C K L">;
  const X x = gs::full<X>(mesh, {1, 2, 6, 6}, 1.0);
  auto message = [](auto&& f) {
    std::string m;
    try {
      f();
    } catch (const gs::Error& e) {
      m = e.what();
    }
    int threw = m.empty() ? 0 : 1, all = 0;
    MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    CHECK(all == world_size());  // identically on every rank
    return m;
  };
  const W w3 = gs::full<W>(mesh, {4, 3, 3, 3}, 1.0);
  std::string m = message([&] { (void)gs::conv2d<"H:K W:L C->O">(x, w3); });
  CHECK(m.find("conv2d \"H:K W:L C->O\"") != std::string::npos);
  CHECK(m.find("'C' has size 2") != std::string::npos);
  CHECK(m.find("[1, 2, 6, 6]") != std::string::npos);
  CHECK(m.find("B C H:x W") != std::string::npos);
  const W w = gs::full<W>(mesh, {4, 2, 3, 7}, 1.0);
  m = message([&] { (void)gs::conv2d<"H:K W:L C->O">(x, w); });
  CHECK(m.find("label 'W'") != std::string::npos);
  CHECK(m.find("smaller than the window's span 7") != std::string::npos);
  m = message([&] {
    (void)gs::conv2d<"H:K W:L C->O">(x, w, {.padding = gs::Padding::same, .stride = {2, 1, 1}});
  });
  CHECK(m.find("needs stride 1") != std::string::npos);
  m = message([&] { (void)gs::max_pool<"HW">(x, {.window = {7, 1}}); });
  CHECK(m.find("max_pool \"HW\"") != std::string::npos);
  CHECK(m.find("label 'H'") != std::string::npos);
  m = message([&] { (void)gs::avg_pool<"W">(x, {.window = {0}}); });
  CHECK(m.find("must be at least 1") != std::string::npos);
}
