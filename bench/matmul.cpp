// Distributed GEMM: C = A B as one gshard einsum ("IK,KJ->IJ" with A "I:x K:y", B "K:x J:y")
// against ScaLAPACK's p?gemm on the same process grid (BLACS row-major px x py = the mesh's x, y),
// for each block size NB. Reports GFLOP/s of both (ScaLAPACK: its best NB, and each), their ratio,
// the bytes gshard sends per rank (its counters, max over ranks, one multiply), the bytes a SUMMA
// (ScaLAPACK's algorithm) sends by a textbook model, and the memory-independent lower bound of
// Al Daas, Ballard et al. (SPAA 2022). Every run checks sampled entries of both results against
// a double-precision dot product of the fill functions; a mismatch makes the exit status 1.
//
//   mpirun -n 4 bench_matmul [--shapes square,tall,outer] [--mnk m,n,k] [--grids 2d,1d]
//       [--types double,float] [--nb 64,128,256] [--scale F] [--reps 3] [--csv out.csv]
//
// Shapes (BLAS m, n, k): square 4096³; tall m 16384, n 1024, k 16384; outer m = n = 16384,
// k 1024; --mnk adds one of its own. --scale divides every size. Grids: 2d is the most square
// px x py = ranks with px >= py (2 ranks: 2x1, 4: 2x2), 1d is ranks x 1; a grid already run is
// not run again.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <gshard/einsum.hpp>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

extern "C" {
void Cblacs_get(int context, int what, int* value);
void Cblacs_gridinit(int* context, const char* order, int rows, int cols);
void Cblacs_gridinfo(int context, int* rows, int* cols, int* row, int* col);
void Cblacs_gridexit(int context);
int numroc_(const int* n, const int* nb, const int* iproc, const int* isrcproc, const int* nprocs);
void descinit_(int* desc, const int* m, const int* n, const int* mb, const int* nb,
               const int* irsrc, const int* icsrc, const int* context, const int* lld, int* info);
void pdgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
             const double* alpha, const double* a, const int* ia, const int* ja, const int* desca,
             const double* b, const int* ib, const int* jb, const int* descb, const double* beta,
             double* c, const int* ic, const int* jc, const int* descc);
void psgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
             const float* alpha, const float* a, const int* ia, const int* ja, const int* desca,
             const float* b, const int* ib, const int* jb, const int* descb, const float* beta,
             float* c, const int* ic, const int* jc, const int* descc);
}

namespace {

using Mesh = gshard::Mesh<"x", "y">;

// Multiples of 1/8 up to 9/8: every product is a multiple of 1/64, so every partial sum up to
// k = 2^17 is exact in float too, in any order; the reference below is then exact.
KOKKOS_INLINE_FUNCTION double a_value(std::int64_t i, std::int64_t k) {
  return static_cast<double>((i * 7 + k * 13) % 17 - 8) / 8.0;
}
KOKKOS_INLINE_FUNCTION double b_value(std::int64_t k, std::int64_t j) {
  return static_cast<double>((k * 5 + j * 11) % 19 - 9) / 8.0;
}

struct GemmShape {
  std::string name;
  std::int64_t m = 0, n = 0, k = 0;
};

struct Grid {
  int px = 1, py = 1;
  std::string kind;  // "2d", "1d", or "2d=1d" when they coincide
};

struct Args {
  std::vector<std::string> shapes;
  std::vector<std::int64_t> mnk;
  std::vector<std::string> grids{"2d", "1d"}, types{"double", "float"};
  std::vector<int> nbs{64, 128, 256};
  double scale = 1;
  int reps = 3;
  std::string csv;
};

std::vector<std::string> split(const std::string& v) {
  std::vector<std::string> out;
  for (std::size_t at = 0; at <= v.size();) {
    const std::size_t comma = std::min(v.find(',', at), v.size());
    if (comma > at) out.push_back(v.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

bool parse(int argc, char** argv, Args& a) {
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_matmul: %s needs a value\n", k.c_str());
      return false;
    }
    const std::string v = argv[i + 1];
    if (k == "--shapes") {
      a.shapes = split(v);
    } else if (k == "--mnk") {
      a.mnk.clear();
      for (const auto& s : split(v)) a.mnk.push_back(std::stoll(s));
      if (a.mnk.size() != 3) {
        std::fprintf(stderr, "bench_matmul: --mnk wants m,n,k\n");
        return false;
      }
    } else if (k == "--grids") {
      a.grids = split(v);
    } else if (k == "--types") {
      a.types = split(v);
    } else if (k == "--nb") {
      a.nbs.clear();
      for (const auto& s : split(v)) a.nbs.push_back(std::stoi(s));
    } else if (k == "--scale") {
      a.scale = std::stod(v);
    } else if (k == "--reps") {
      a.reps = std::max(1, std::stoi(v));
    } else if (k == "--csv") {
      a.csv = v;
    } else {
      std::fprintf(stderr, "bench_matmul: unknown option %s\n", k.c_str());
      return false;
    }
  }
  return true;
}

double max_over_ranks(double t) {
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

// The positions the check reads: the four corners and pseudo-random ones, alike on every rank.
std::vector<std::pair<std::int64_t, std::int64_t>> sample_positions(const GemmShape& s) {
  std::vector<std::pair<std::int64_t, std::int64_t>> at{
      {0, 0}, {0, s.n - 1}, {s.m - 1, 0}, {s.m - 1, s.n - 1}};
  std::uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (int i = 0; i < 44; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    const auto hi = x >> 33;
    at.emplace_back(static_cast<std::int64_t>(hi % static_cast<std::uint64_t>(s.m)),
                    static_cast<std::int64_t>((hi >> 8) % static_cast<std::uint64_t>(s.n)));
  }
  return at;
}

// How many sampled entries of `got` differ from the exact dot product by more than a rounding
// bound (4 eps per unit of sum |a b|; with these fills they should be equal).
template <class T>
int count_mismatches(const GemmShape& s,
                     const std::vector<std::pair<std::int64_t, std::int64_t>>& at,
                     const std::vector<double>& got, const char* who) {
  int bad = 0;
  for (std::size_t p = 0; p < at.size(); ++p) {
    const auto [i, j] = at[p];
    double exact = 0, magnitude = 0;
    for (std::int64_t k = 0; k < s.k; ++k) {
      const double t = static_cast<double>(static_cast<T>(a_value(i, k))) *
                       static_cast<double>(static_cast<T>(b_value(k, j)));
      exact += t;
      magnitude += std::fabs(t);
    }
    const double tol = 4 * std::numeric_limits<T>::epsilon() * magnitude;
    if (std::fabs(got[p] - exact) > tol) {
      if (bad < 3)
        std::fprintf(stderr, "bench_matmul: %s C(%lld, %lld) = %.17g, expected %.17g\n", who,
                     static_cast<long long>(i), static_cast<long long>(j), got[p], exact);
      ++bad;
    }
  }
  return bad;
}

// ---- gshard ----

// The padded local block of an rows x cols tensor, valid part from `fill`, padding zero. Not a
// function of the spec: nvcc cannot name a device lambda inside one (docs/backends.md).
template <class T>
void fill_block(const Kokkos::View<T*>& v, const gshard::Shape& padded, const gshard::Shape& off,
                const gshard::Shape& valid, bool is_a) {
  const std::int64_t cols = padded[1], o0 = off[0], o1 = off[1], v0 = valid[0], v1 = valid[1];
  Kokkos::parallel_for(
      "bench_matmul fill", Kokkos::RangePolicy<Kokkos::IndexType<std::int64_t>>(0, v.extent(0)),
      KOKKOS_LAMBDA(const std::int64_t at) {
        const std::int64_t r = at / cols, c = at % cols;
        const double x = r >= v0 || c >= v1 ? 0.0
                         : is_a             ? a_value(o0 + r, o1 + c)
                                            : b_value(o0 + r, o1 + c);
        v(at) = static_cast<T>(x);
      });
}

template <class S>
S filled(const Mesh& mesh, std::int64_t rows, std::int64_t cols, bool is_a) {
  S t(mesh, {rows, cols});
  fill_block(t.local_view(), t.local_shape(), t.global_offsets(), t.valid_extents(), is_a);
  Kokkos::fence();
  t.mark_modified();
  return t;
}

// C at the sampled positions, on every rank. Each rank reads the entries in its block; copies
// over an axis that neither splits C nor holds partial sums count once, partial sums all count.
template <class C>
std::vector<double> gshard_samples(const C& c,
                                   const std::vector<std::pair<std::int64_t, std::int64_t>>& at) {
  constexpr gshard::Layout layout = C::layout;
  constexpr int di = layout.find('I'), dj = layout.find('J');
  static_assert(di >= 0 && dj >= 0);
  std::vector<double> out(at.size(), 0.0);
  bool counts = true;
  for (int a = 0; a < Mesh::axis_count; ++a)
    if (layout.dim_on_axis(a) < 0 && !layout.is_partial(a) && c.mesh().coordinate(a) != 0)
      counts = false;
  if (counts) {
    const auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), c.local_view());
    const gshard::Shape pad = c.local_shape(), off = c.global_offsets(), valid = c.valid_extents();
    for (std::size_t p = 0; p < at.size(); ++p) {
      const std::int64_t li = at[p].first - off[di], lj = at[p].second - off[dj];
      if (li < 0 || lj < 0 || li >= valid[di] || lj >= valid[dj]) continue;
      const std::int64_t flat = di == 0 ? li * pad[1] + lj : lj * pad[1] + li;
      out[p] = static_cast<double>(host(flat));
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, out.data(), static_cast<int>(out.size()), MPI_DOUBLE, MPI_SUM,
                MPI_COMM_WORLD);
  return out;
}

struct GshardResult {
  double seconds = 0;
  long long bytes = 0;  // sent by the busiest rank in one multiply
  std::vector<double> samples;
};

template <class T>
GshardResult run_gshard(const Mesh& mesh, const GemmShape& s, int reps,
                        const std::vector<std::pair<std::int64_t, std::int64_t>>& at) {
  using A = gshard::Sharded<T, Mesh, "I:x K:y">;
  using B = gshard::Sharded<T, Mesh, "K:x J:y">;
  const A a = filled<A>(mesh, s.m, s.k, true);
  const B b = filled<B>(mesh, s.k, s.n, false);
  GshardResult r;
  r.seconds = 1e300;
  // The warm-up multiply is the one whose bytes are counted and whose result is checked.
  {
    gshard::comm_counters().reset();
    const auto c = gshard::einsum<"IK,KJ->IJ">(a, b).eval();
    Kokkos::fence();
    r.bytes = gshard::comm_counters().total().bytes;
    MPI_Allreduce(MPI_IN_PLACE, &r.bytes, 1, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    r.samples = gshard_samples(c, at);
  }
  for (int rep = 0; rep < reps; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t = 0;
    {
      const double t0 = MPI_Wtime();
      const auto c = gshard::einsum<"IK,KJ->IJ">(a, b).eval();
      Kokkos::fence();
      t = MPI_Wtime() - t0;
    }  // C freed after the timing, before the next rep allocates another
    r.seconds = std::min(r.seconds, max_over_ranks(t));
  }
  return r;
}

// ---- ScaLAPACK ----

class Blacs {
 public:
  Blacs(int px, int py) {
    Cblacs_get(-1, 0, &ctx_);
    Cblacs_gridinit(&ctx_, "Row", px, py);  // row-major, as the mesh: rank = row * py + col
    Cblacs_gridinfo(ctx_, &rows_, &cols_, &row_, &col_);
  }
  Blacs(const Blacs&) = delete;
  Blacs& operator=(const Blacs&) = delete;
  ~Blacs() { Cblacs_gridexit(ctx_); }
  int ctx_ = 0, rows_ = 0, cols_ = 0, row_ = 0, col_ = 0;
};

// A rows x cols matrix distributed NB x NB block-cyclically, column-major locally.
template <class T>
struct BlockCyclic {
  int rows, cols, nb, local_rows, local_cols, lld;
  int desc[9]{};
  std::vector<T> data;

  BlockCyclic(const Blacs& g, int rows_, int cols_, int nb_) : rows(rows_), cols(cols_), nb(nb_) {
    const int zero = 0;
    local_rows = numroc_(&rows, &nb, &g.row_, &zero, &g.rows_);
    local_cols = numroc_(&cols, &nb, &g.col_, &zero, &g.cols_);
    lld = std::max(1, local_rows);
    int info = 0;
    descinit_(desc, &rows, &cols, &nb, &nb, &zero, &zero, &g.ctx_, &lld, &info);
    if (info != 0) throw std::runtime_error("descinit_ failed: info " + std::to_string(info));
    data.assign(static_cast<std::size_t>(lld) * static_cast<std::size_t>(local_cols), T{});
  }
  [[nodiscard]] std::int64_t global_row(const Blacs& g, int il) const {
    return (static_cast<std::int64_t>(il / nb) * g.rows_ + g.row_) * nb + il % nb;
  }
  [[nodiscard]] std::int64_t global_col(const Blacs& g, int jl) const {
    return (static_cast<std::int64_t>(jl / nb) * g.cols_ + g.col_) * nb + jl % nb;
  }
  template <class F>
  void fill(const Blacs& g, F f) {
    for (int jl = 0; jl < local_cols; ++jl) {
      const std::int64_t gj = global_col(g, jl);
      T* column = data.data() + static_cast<std::size_t>(jl) * static_cast<std::size_t>(lld);
      for (int il = 0; il < local_rows; ++il) column[il] = static_cast<T>(f(global_row(g, il), gj));
    }
  }
};

void pgemm(int m, int n, int k, const BlockCyclic<double>& a, const BlockCyclic<double>& b,
           BlockCyclic<double>& c) {
  const double one = 1, zero = 0;
  const int i1 = 1;
  pdgemm_("N", "N", &m, &n, &k, &one, a.data.data(), &i1, &i1, a.desc, b.data.data(), &i1, &i1,
          b.desc, &zero, c.data.data(), &i1, &i1, c.desc);
}
void pgemm(int m, int n, int k, const BlockCyclic<float>& a, const BlockCyclic<float>& b,
           BlockCyclic<float>& c) {
  const float one = 1, zero = 0;
  const int i1 = 1;
  psgemm_("N", "N", &m, &n, &k, &one, a.data.data(), &i1, &i1, a.desc, b.data.data(), &i1, &i1,
          b.desc, &zero, c.data.data(), &i1, &i1, c.desc);
}

struct ScalapackResult {
  double seconds = 0;
  std::vector<double> samples;
};

template <class T>
ScalapackResult run_scalapack(const Blacs& g, const GemmShape& s, int nb, int reps,
                              const std::vector<std::pair<std::int64_t, std::int64_t>>& at) {
  const int m = static_cast<int>(s.m), n = static_cast<int>(s.n), k = static_cast<int>(s.k);
  BlockCyclic<T> a(g, m, k, nb), b(g, k, n, nb), c(g, m, n, nb);
  a.fill(g, a_value);
  b.fill(g, b_value);
  ScalapackResult r;
  r.seconds = 1e300;
  pgemm(m, n, k, a, b, c);  // warm-up
  for (int rep = 0; rep < reps; ++rep) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    pgemm(m, n, k, a, b, c);
    r.seconds = std::min(r.seconds, max_over_ranks(MPI_Wtime() - t0));
  }
  // Each entry lives on one process: the one owning its row block and its column block.
  r.samples.assign(at.size(), 0.0);
  for (std::size_t p = 0; p < at.size(); ++p) {
    const auto [i, j] = at[p];
    if ((i / nb) % g.rows_ != g.row_ || (j / nb) % g.cols_ != g.col_) continue;
    const std::int64_t il = i / (static_cast<std::int64_t>(nb) * g.rows_) * nb + i % nb;
    const std::int64_t jl = j / (static_cast<std::int64_t>(nb) * g.cols_) * nb + j % nb;
    r.samples[p] = static_cast<double>(c.data[static_cast<std::size_t>(il + jl * c.lld)]);
  }
  MPI_Allreduce(MPI_IN_PLACE, r.samples.data(), static_cast<int>(r.samples.size()), MPI_DOUBLE,
                MPI_SUM, MPI_COMM_WORLD);
  return r;
}

// ---- communication volumes, in elements per rank ----

// SUMMA on px x py: each rank receives the (py-1)/py of its A row panel it lacks and the (px-1)/px
// of its B column panel; a model of ScaLAPACK's traffic (it broadcasts panels along rows and
// columns), not a count.
double summa_words(const GemmShape& s, int px, int py) {
  const double m = static_cast<double>(s.m), n = static_cast<double>(s.n),
               k = static_cast<double>(s.k);
  return m / px * k * (py - 1) / py + k * (n / py) * (px - 1) / px;
}

// Al Daas, Ballard, Grigori, Kumar, Rouse, "Tight memory-independent parallel matrix
// multiplication communication lower bounds", SPAA 2022 (Theorem 3): words some rank must send or
// receive, beyond the 1/P of the three matrices it may start or end with.
double lower_bound_words(const GemmShape& s, int ranks) {
  double d[3] = {static_cast<double>(s.m), static_cast<double>(s.n), static_cast<double>(s.k)};
  std::sort(d, d + 3, [](double x, double y) { return x > y; });
  const double p = ranks, d1 = d[0], d2 = d[1], d3 = d[2];
  double l = 0;
  if (p <= d1 / d2)
    l = (d1 * d2 + d1 * d3) / p + d2 * d3;
  else if (p <= d1 * d2 / (d3 * d3))
    l = 2 * std::sqrt(d1 * d2 * d3 * d3 / p) + d1 * d2 / p;
  else
    l = 3 * std::pow(d1 * d2 * d3 / p, 2.0 / 3.0);
  const double m = static_cast<double>(s.m), n = static_cast<double>(s.n),
               k = static_cast<double>(s.k);
  return std::max(0.0, l - (m * n + m * k + n * k) / p);
}

// ---- one row of the table ----

template <class T>
int run_case(const Grid& grid, const GemmShape& s, const Args& args, const char* type,
             std::FILE* csv) {
  int ranks = 1, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const auto at = sample_positions(s);
  const double flops =
      2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  // gshard first, its tensors freed before ScaLAPACK allocates (16k² doubles are 2 GiB).
  GshardResult g;
  {
    const Mesh mesh(MPI_COMM_WORLD, {grid.px, grid.py});
    g = run_gshard<T>(mesh, s, args.reps, at);
  }
  int bad = 0;
  if (me == 0) bad += count_mismatches<T>(s, at, g.samples, "gshard");
  double best = 1e300;
  int best_nb = 0;
  std::string each;
  {
    const Blacs blacs(grid.px, grid.py);
    for (const int nb : args.nbs) {
      const ScalapackResult r = run_scalapack<T>(blacs, s, nb, args.reps, at);
      if (me == 0) bad += count_mismatches<T>(s, at, r.samples, "ScaLAPACK");
      if (r.seconds < best) {
        best = r.seconds;
        best_nb = nb;
      }
      char one[48];
      std::snprintf(one, sizeof one, "%s%d:%.3f", each.empty() ? "" : " ", nb,
                    flops / r.seconds / 1e9);
      each += one;
    }
  }
  MPI_Bcast(&bad, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (me == 0) {
    const double g_rate = flops / g.seconds / 1e9, s_rate = flops / best / 1e9;
    const double summa = summa_words(s, grid.px, grid.py) * sizeof(T);
    const double bound = lower_bound_words(s, ranks) * sizeof(T);
    std::printf(
        "np%d %dx%d (%s) %s %lldx%lldx%lld %s: gshard %.2f GFLOP/s, ScaLAPACK %.2f (NB %d; %s), "
        "ratio %.3f; bytes/rank gshard %lld, SUMMA model %.0f, lower bound %.0f; %s\n",
        ranks, grid.px, grid.py, grid.kind.c_str(), s.name.c_str(), static_cast<long long>(s.m),
        static_cast<long long>(s.n), static_cast<long long>(s.k), type, g_rate, s_rate, best_nb,
        each.c_str(), g_rate / s_rate, g.bytes, summa, bound, bad == 0 ? "check ok" : "MISMATCH");
    if (csv != nullptr)
      std::fprintf(csv, "%d,%dx%d,%s,%s,%lld,%lld,%lld,%s,%.3f,%.3f,%d,%s,%.4f,%lld,%.0f,%.0f,%s\n",
                   ranks, grid.px, grid.py, grid.kind.c_str(), s.name.c_str(),
                   static_cast<long long>(s.m), static_cast<long long>(s.n),
                   static_cast<long long>(s.k), type, g_rate, s_rate, best_nb, each.c_str(),
                   g_rate / s_rate, g.bytes, summa, bound, bad == 0 ? "ok" : "MISMATCH");
    std::fflush(stdout);
  }
  return bad;
}

}  // namespace

int main(int argc, char** argv) {
  gshard::Environment env(argc, argv);
  Args args;
  if (!parse(argc, argv, args)) return 2;
  int ranks = 1, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);

  std::vector<GemmShape> shapes;
  std::vector<std::string> names = args.shapes;
  if (names.empty() && args.mnk.empty()) names = {"square", "tall", "outer"};
  for (const auto& name : names) {
    if (name == "square") {
      shapes.push_back({name, 4096, 4096, 4096});
    } else if (name == "tall") {
      shapes.push_back({name, 16384, 1024, 16384});
    } else if (name == "outer") {
      shapes.push_back({name, 16384, 16384, 1024});
    } else {
      if (me == 0) std::fprintf(stderr, "bench_matmul: unknown shape %s\n", name.c_str());
      return 2;
    }
  }
  if (!args.mnk.empty()) shapes.push_back({"mnk", args.mnk[0], args.mnk[1], args.mnk[2]});
  for (auto& s : shapes)
    for (std::int64_t* d : {&s.m, &s.n, &s.k})
      *d = std::max<std::int64_t>(1, std::llround(static_cast<double>(*d) / args.scale));

  std::vector<Grid> grids;
  for (const auto& kind : args.grids) {
    Grid g{ranks, 1, kind};
    if (kind == "2d") {
      for (int p = 1; p * p <= ranks; ++p)
        if (ranks % p == 0) g.py = p;
      g.px = ranks / g.py;
    } else if (kind != "1d") {
      if (me == 0) std::fprintf(stderr, "bench_matmul: unknown grid %s\n", kind.c_str());
      return 2;
    }
    auto same = std::find_if(grids.begin(), grids.end(),
                             [&](const Grid& o) { return o.px == g.px && o.py == g.py; });
    if (same == grids.end())
      grids.push_back(g);
    else if (same->kind != kind)
      same->kind += "=" + kind;
  }

  std::FILE* csv = me == 0 && !args.csv.empty() ? std::fopen(args.csv.c_str(), "w") : nullptr;
  if (csv != nullptr)
    std::fprintf(csv,
                 "ranks,grid,grid_kind,shape,m,n,k,type,gshard_gflops,scalapack_gflops,best_nb,"
                 "scalapack_gflops_per_nb,ratio,gshard_bytes_per_rank,summa_model_bytes_per_rank,"
                 "lower_bound_bytes_per_rank,check\n");
  int bad = 0;
  for (const auto& s : shapes)
    for (const auto& type : args.types)
      for (const auto& grid : grids) {
        if (type == "double") {
          bad += run_case<double>(grid, s, args, "double", csv);
        } else if (type == "float") {
          bad += run_case<float>(grid, s, args, "float", csv);
        } else {
          if (me == 0) std::fprintf(stderr, "bench_matmul: unknown type %s\n", type.c_str());
          bad = 1;
        }
      }
  if (csv != nullptr) std::fclose(csv);
  return bad == 0 ? 0 : 1;
}
