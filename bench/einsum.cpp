// bench_einsum: the local contraction of an einsum (one rank, one thread) against the GEMM
// libraries it could have called directly, on the same shapes and buffers.
//
// Shapes: MoE expert layers ECM,EMH->ECH (E=8 experts, C=256/512/1024 tokens per expert, M=512,
// H=2048), a batched GEMM of E products [C,M]x[M,H]; square GEMMs IJ,JK->IK, N=512..2048.
// For each shape, interleaved in every repetition after a warm-up:
//   eigen     Eigen::Map row-major, c.noalias() = a * b, one call per batch;
//   openblas  cblas_sgemm row-major, one call per batch (absent when the build has no CBLAS);
//   gshard    gshard::detail::contract<float> on LocalBlocks: the local kernel every einsum runs
//             (what the acceptance measures);
//   einsum    the whole public call, result = gshard::einsum<...>(a, b) on a 1-rank mesh,
//             allocation of the result included (reported, not part of the acceptance).
// GFLOP/s = 2*batch*m*n*k / median time. ratio = gshard / the faster of eigen and openblas.
// Every result is checked against openblas (or eigen) once, so the bench cannot time garbage.
//
// Threads: Eigen is built without OpenMP here (1 thread); run with OPENBLAS_NUM_THREADS=1
// (bench/run_einsum.sh does) so that every column is one thread. The header prints both counts.
//
// Repetitions: at least --reps (7), more for small shapes so that each shape runs about
// --min-seconds (3) in all: a 3 ms GEMM timed 7 times is at the mercy of one interruption.
//
// Usage: bench_einsum [--csv PATH] [--reps N] [--min-seconds S] [--warmup N] [--only TEXT]
#include <mpi.h>

#include <Eigen/Core>
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <gshard/gshard.hpp>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "common.hpp"

#if defined(GSHARD_HAVE_CBLAS)
#include <cblas.h>
#endif

namespace {

using bench::median;

using Line = gshard::Mesh<"x">;
using gshard::detail::LocalBlock;

struct Options {
  std::string csv = "bench_einsum.csv";
  int reps = 7;            // at least this many repetitions per shape
  double min_seconds = 3;  // and more for small shapes, until a shape takes about this long
  int warmup = 1;
  std::string only;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("bench_einsum: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--csv") {
      o.csv = value();
    } else if (a == "--reps") {
      o.reps = std::max(1, std::stoi(value()));
    } else if (a == "--min-seconds") {
      o.min_seconds = std::stod(value());
    } else if (a == "--warmup") {
      o.warmup = std::stoi(value());
    } else if (a == "--only") {
      o.only = value();
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_einsum [--csv PATH] [--reps N] [--min-seconds S] [--warmup N] "
          "[--only TEXT]\n");
      std::exit(0);
    } else {
      throw std::runtime_error("bench_einsum: unknown option " + a);
    }
  }
  return o;
}

template <class F>
double seconds(F&& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  Kokkos::fence();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

using View = Kokkos::View<float*>;

View random_view(std::int64_t n, std::uint64_t seed) {
  View v(Kokkos::view_alloc(std::string("bench::in"), Kokkos::WithoutInitializing), n);
  auto h = Kokkos::create_mirror_view(v);
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (std::int64_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    h(i) = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 * 2.0 - 1.0);
  }
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<float> host_copy(const View& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return {h.data(), h.data() + h.extent(0)};
}

/// max |x - ref| / max |ref|.
double rel_error(const std::vector<float>& x, const std::vector<float>& ref) {
  double err = 0, scale = 0;
  for (std::size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(static_cast<double>(x[i]) - static_cast<double>(ref[i])));
    scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
  }
  return scale > 0 ? err / scale : err;
}

struct Case {
  std::string name;    // e.g. "moe C=256"
  std::string einsum;  // e.g. "ECM,EMH->ECH"
  LocalBlock a, b, out;
  std::int64_t batch, m, n, k;
};

struct Result {
  Case c;
  int reps = 0;
  double eigen_s = 0, blas_s = 0, gshard_s = 0, public_s = 0;  // medians; 0: not run
  double error = 0;                                            // worst relative error
};

/// The public call for one einsum, when the current API can produce a Sharded of spec SO from it
/// (the einsum API is moving to lazy expressions; this keeps the bench independent of that).
template <gshard::fixed_string Einsum, gshard::fixed_string SA, gshard::fixed_string SB,
          gshard::fixed_string SO>
std::function<View()> public_call(const Line& mesh, const Case& c, const View& a, const View& b) {
  using A = gshard::Sharded<float, Line, SA>;
  using B = gshard::Sharded<float, Line, SB>;
  using Out = gshard::Sharded<float, Line, SO>;
  const A sa(mesh, gshard::Shape(c.a.extents), a);
  const B sb(mesh, gshard::Shape(c.b.extents), b);
  if constexpr (requires { Out(gshard::einsum<Einsum>(sa, sb)); }) {
    return [sa, sb] {
      const Out r(gshard::einsum<Einsum>(sa, sb));
      return r.local_view();
    };
  } else {
    return {};
  }
}

Result run_case(const Options& o, const Line& mesh, const Case& c) {
  Result r{c, o.reps};
  const View a = random_view(c.a.size(), 1);
  const View b = random_view(c.b.size(), 2);
  const View c_eigen("bench::eigen", c.out.size());
  const View c_blas("bench::blas", c.out.size());
  const View c_ours("bench::gshard", c.out.size());
  View c_public;

  auto eigen = [&] {
    using Matrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
    for (std::int64_t i = 0; i < c.batch; ++i) {
      const Eigen::Map<const Matrix> am(a.data() + i * c.m * c.k, c.m, c.k);
      const Eigen::Map<const Matrix> bm(b.data() + i * c.k * c.n, c.k, c.n);
      Eigen::Map<Matrix> cm(c_eigen.data() + i * c.m * c.n, c.m, c.n);
      cm.noalias() = am * bm;
    }
  };
#if defined(GSHARD_HAVE_CBLAS)
  auto blas = [&] {
    const int m = static_cast<int>(c.m), n = static_cast<int>(c.n), k = static_cast<int>(c.k);
    for (std::int64_t i = 0; i < c.batch; ++i)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f,
                  a.data() + i * c.m * c.k, k, b.data() + i * c.k * c.n, n, 0.0f,
                  c_blas.data() + i * c.m * c.n, n);
  };
#endif
  auto ours = [&] {
    const gshard::detail::GemmShape s =
        gshard::detail::contract<float>(a.data(), c.a, b.data(), c.b, c_ours.data(), c.out);
    if (s.batch != c.batch || s.m != c.m || s.n != c.n || s.k != c.k)
      throw std::runtime_error("bench_einsum: " + c.name + ": unexpected GEMM shape");
  };
  std::function<View()> pub;
  if (c.einsum == "ECM,EMH->ECH")
    pub = public_call<"ECM,EMH->ECH", "E C M", "E M H", "E C H">(mesh, c, a, b);
  else
    pub = public_call<"IJ,JK->IK", "I J", "J K", "I K">(mesh, c, a, b);

  std::vector<double> te, tb, tg, tp;
  for (int rep = -o.warmup; rep < r.reps; ++rep) {
    const double e = seconds(eigen);
#if defined(GSHARD_HAVE_CBLAS)
    const double bl = seconds(blas);
#else
    const double bl = 0;
#endif
    const double g = seconds(ours);
    const double p = pub ? seconds([&] { c_public = pub(); }) : 0;
    if (rep < 0) {
      const double once = e + bl + g + p;
      if (rep == -1 && once > 0)
        r.reps = std::max(o.reps, static_cast<int>(std::ceil(o.min_seconds / once)));
      continue;
    }
    te.push_back(e);
    tb.push_back(bl);
    tg.push_back(g);
    tp.push_back(p);
  }
  r.eigen_s = median(te);
  r.blas_s = median(tb);
  r.gshard_s = median(tg);
  r.public_s = median(tp);

  const std::vector<float> ref = host_copy(r.blas_s > 0 ? c_blas : c_eigen);
  r.error = std::max(rel_error(host_copy(c_eigen), ref), rel_error(host_copy(c_ours), ref));
  if (c_public.data() != nullptr) r.error = std::max(r.error, rel_error(host_copy(c_public), ref));
  return r;
}

double gflops(const Case& c, double s) {
  return s > 0 ? 2.0 * static_cast<double>(c.batch * c.m * c.n * c.k) / s * 1e-9 : 0;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  const std::int64_t e = 8, m = 512, h = 2048;
  for (std::int64_t cap : {256, 512, 1024})
    v.push_back({"moe C=" + std::to_string(cap),
                 "ECM,EMH->ECH",
                 {"ECM", {e, cap, m}},
                 {"EMH", {e, m, h}},
                 {"ECH", {e, cap, h}},
                 e,
                 cap,
                 h,
                 m});
  for (std::int64_t n : {512, 1024, 1536, 2048})
    v.push_back({"square N=" + std::to_string(n),
                 "IJ,JK->IK",
                 {"IJ", {n, n}},
                 {"JK", {n, n}},
                 {"IK", {n, n}},
                 1,
                 n,
                 n,
                 n});
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  gshard::Environment env(argc, argv, {.tune_malloc = true});  // owns its process
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != 1) {
    std::fprintf(stderr, "bench_einsum: run it on one rank\n");
    return 2;
  }
  int status = 0;
  try {
    const Options o = parse(argc, argv);
    const Line mesh(MPI_COMM_WORLD, {1});
#if defined(GSHARD_HAVE_CBLAS)
    const int blas_threads = openblas_get_num_threads();
    const std::string blas =
        std::string(openblas_get_config()) + ", " + std::to_string(blas_threads) + " thread(s)";
#else
    const int blas_threads = 0;
    const std::string blas = "no CBLAS in this build (gshard uses Eigen)";
#endif
    const int eigen_threads = Eigen::nbThreads();
    std::printf("bench_einsum: 1 rank; Eigen %d.%d.%d, %d thread(s); %s; Kokkos %s\n",
                EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, eigen_threads,
                blas.c_str(), Kokkos::DefaultExecutionSpace::name());
    if (blas_threads > 1)
      std::printf(
          "bench_einsum: note: OpenBLAS runs %d threads, Eigen %d: set "
          "OPENBLAS_NUM_THREADS=1 to compare like for like\n",
          blas_threads, eigen_threads);
    std::printf("GFLOP/s, median of at least %d repetitions (%g s per shape), %d warm-up(s)\n\n",
                o.reps, o.min_seconds, o.warmup);
    std::printf("%-16s %-14s %5s %5s %5s %5s %5s %8s %8s %8s %8s %6s %6s %8s\n", "case", "einsum",
                "batch", "m", "n", "k", "reps", "eigen", "openblas", "gshard", "einsum", "ratio",
                "r.ein", "rel.err");
    std::vector<Result> results;
    bool ok = true;
    for (const Case& c : cases()) {
      if (!o.only.empty() && c.name.find(o.only) == std::string::npos) continue;
      const Result r = run_case(o, mesh, c);
      const double ge = gflops(c, r.eigen_s), gb = gflops(c, r.blas_s);
      const double gg = gflops(c, r.gshard_s), gp = gflops(c, r.public_s);
      const double best = std::max(ge, gb);
      const bool good = r.error < 1e-4;
      ok = ok && good;
      std::printf(
          "%-16s %-14s %5lld %5lld %5lld %5lld %5d %8.1f %8.1f %8.1f %8.1f %6.2f %6.2f %8.1e%s\n",
          c.name.c_str(), c.einsum.c_str(), static_cast<long long>(c.batch),
          static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k),
          r.reps, ge, gb, gg, gp, gg / best, gp / best, r.error, good ? "" : "  WRONG");
      std::fflush(stdout);
      results.push_back(r);
    }

    std::FILE* f = std::fopen(o.csv.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("bench_einsum: cannot write " + o.csv);
    std::fprintf(f, "# blas: %s\n# eigen_threads: %d\n", blas.c_str(), eigen_threads);
    std::fprintf(f,
                 "case,einsum,batch,m,n,k,reps,eigen_ms,openblas_ms,gshard_ms,einsum_ms,"
                 "eigen_gflops,openblas_gflops,gshard_gflops,einsum_gflops,ratio,ratio_einsum,"
                 "rel_error\n");
    for (const Result& r : results) {
      const Case& c = r.c;
      const double best = std::max(gflops(c, r.eigen_s), gflops(c, r.blas_s));
      std::fprintf(f,
                   "%s,\"%s\",%lld,%lld,%lld,%lld,%d,%.3f,%.3f,%.3f,%.3f,%.2f,%.2f,%.2f,%.2f,%.4f,%"
                   ".4f,%.2e\n",
                   c.name.c_str(), c.einsum.c_str(), static_cast<long long>(c.batch),
                   static_cast<long long>(c.m), static_cast<long long>(c.n),
                   static_cast<long long>(c.k), r.reps, r.eigen_s * 1e3, r.blas_s * 1e3,
                   r.gshard_s * 1e3, r.public_s * 1e3, gflops(c, r.eigen_s), gflops(c, r.blas_s),
                   gflops(c, r.gshard_s), gflops(c, r.public_s), gflops(c, r.gshard_s) / best,
                   gflops(c, r.public_s) / best, r.error);
    }
    std::fclose(f);
    std::printf("\nwrote %s\n", o.csv.c_str());
    status = ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_einsum: %s\n", e.what());
    status = 2;
  }
  return status;
}
