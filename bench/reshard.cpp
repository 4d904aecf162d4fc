// bench_reshard: every transition of GShard's resharding table, timed through gshard and through
// a hand-written MPI program doing the same collective on the same buffers, in one run.
//
// For each case (a source and a target layout, a per-rank payload) the bench times, interleaved
// and after a warm-up:
//   mpi     the bare MPI collective (MPI_Allgather, MPI_Alltoall, MPI_Allreduce,
//           MPI_Reduce_scatter_block, MPI_Sendrecv) on preallocated buffers of the sizes gshard
//           uses, over the same sub-communicator (mesh.group(mask));
//   ref     the hand-written program that produces the target's local block: the bare
//           collective when the split dimension is the outermost one (zero-copy), plus the
//           row-by-row memcpy packing/unpacking a careful MPI programmer writes otherwise; for
//           the local slice (no communication) a memcpy of the local block;
//   gshard  y = gshard::reshard<Target>(x)      (allocates its result every call);
//   into    gshard::reshard_into(x, y)          (reuses y's storage).
// Each repetition is barrier-synchronised and its time is the maximum over the ranks; the table
// shows medians. Ratios are throughput ratios gshard/ref = t_ref / t_gshard (1.0 = as fast as
// the hand-written program). One result of each gshard entry point and of the reference is
// checked against to_global() of the source, so the bench cannot time garbage.
//
// Payload: the bytes of the source's local shard on each rank (what each rank contributes).
//
// Usage: mpirun -n N bench_reshard [--csv PATH] [--reps N] [--warmup N] [--sizes 1,4,16]
//                                  [--only TEXT[,TEXT...]]   (cases whose "transition split"
//                                                             contains one of the texts)
//                                  [--dynamic-mmap] (leave glibc's mmap threshold alone)
#include <mpi.h>
#include <sys/resource.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <gshard/gshard.hpp>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

using bench::median;

using gshard::Shape;
using Line = gshard::Mesh<"x">;       // every rank on one axis
using Grid = gshard::Mesh<"a", "b">;  // m x m, for CollectivePermute
// The layouts measured, spelled without an alias template: nvcc 13 writes an alias template's
// string argument into its host code as an undeclared temporary (docs/backends.md).
using LineReplicated = gshard::Sharded<float, Line, "A B">;
using LineRows = gshard::Sharded<float, Line, "A:x B">;
using LineColumns = gshard::Sharded<float, Line, "A B:x">;
using LinePartial = gshard::Sharded<float, Line, "A B +x">;
using GridRowsOverA = gshard::Sharded<float, Grid, "A:a B">;
using GridRowsOverB = gshard::Sharded<float, Grid, "A:b B">;

constexpr std::int64_t row = 1024;  // floats in the innermost dimension of every global shape

struct Options {
  std::string csv = "bench_reshard.csv";
  int reps = 30;
  int warmup = 3;
  std::vector<int> sizes_mib = {1, 4, 16};
  std::vector<std::string> only;  // run only the cases whose "transition split" contains one
  bool dynamic_mmap = false;      // keep glibc's history-dependent mmap threshold
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("bench_reshard: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--csv") {
      o.csv = value();
    } else if (a == "--reps") {
      o.reps = std::stoi(value());
    } else if (a == "--warmup") {
      o.warmup = std::stoi(value());
    } else if (a == "--sizes") {
      o.sizes_mib.clear();
      for (const std::string& s : bench::split(value(), ',')) o.sizes_mib.push_back(std::stoi(s));
    } else if (a == "--only") {
      o.only = bench::split(value(), ',');
    } else if (a == "--dynamic-mmap") {
      o.dynamic_mmap = true;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_reshard [--csv PATH] [--reps N] [--warmup N] [--sizes 1,4,16] "
          "[--only TEXT[,TEXT...]] [--dynamic-mmap]\n");
      std::exit(0);
    } else {
      throw std::runtime_error("bench_reshard: unknown option " + a);
    }
  }
  return o;
}

/// One row of the table.
struct Result {
  std::string transition;  // GShard's name of the transition
  std::string collective;  // the MPI call of the reference
  std::string source, target;
  std::string split;  // outer (zero-copy) or inner (packing)
  int ranks = 0;
  int group = 0;  // ranks in the sub-communicator
  std::int64_t payload = 0;
  int reps = 0;
  double mpi_us = 0, ref_us = 0, gshard_us = 0, into_us = 0, plan_us = 0;
  // Minor page faults per call (median over repetitions, maximum over ranks): first touches
  // of freshly mapped memory, the cost of allocating per call.
  double ref_faults = 0, gshard_faults = 0, into_faults = 0;
};

/// A host buffer for the hand-written side, allocated like gshard's (Kokkos). Not std::vector:
/// two vectors of a few MiB come from malloc 16 bytes apart modulo 4 KiB, and MPI's copies and
/// reductions from one into the other then suffer false store-to-load dependences ("4K
/// aliasing"): MPI_Allreduce of 1 MiB took 3.7x as long with the receive buffer 16 bytes past
/// the send buffer modulo 4 KiB as with 0 or 64 (Open MPI 4.1, this machine). That would have
/// flattered gshard. Zero-filled, so every page is touched before timing.
struct Buffer {
  Kokkos::View<float*, Kokkos::HostSpace> view;
  void assign(std::int64_t n) { view = Kokkos::View<float*, Kokkos::HostSpace>("bench::raw", n); }
  [[nodiscard]] float* data() const { return view.data(); }
  [[nodiscard]] std::size_t size() const { return view.extent(0); }
  [[nodiscard]] std::vector<float> values() const { return {data(), data() + size()}; }
};

/// The hand-written side of a case: buffers allocated (and touched) once, and two programs.
struct Raw {
  Buffer in, out, scratch;
  std::function<void()> collective;  // the bare MPI call
  std::function<void()> program;     // collective plus hand packing: leaves the target block in out
};

std::vector<float> host_copy(const Kokkos::View<float*>& v) {
  auto h = Kokkos::create_mirror_view(v);
  Kokkos::deep_copy(h, v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

Buffer host_buffer(const Kokkos::View<float*>& v) {
  Buffer b;
  b.assign(static_cast<std::int64_t>(v.extent(0)));
  Kokkos::deep_copy(b.view, v);
  return b;
}

class Bench {
 public:
  Bench(Options o, int rank, int size) : opt_(std::move(o)), rank_(rank), size_(size) {}

  /// Times one case. `make_raw` builds the reference on the source's local block.
  template <class Target, class Source, class MeshT>
  void run(const MeshT& mesh, const std::string& transition, const std::string& collective,
           const std::string& split, unsigned mask, Shape shape,
           const std::function<void(Raw&)>& make_raw) {
    const std::string name = transition + " " + split;
    if (!opt_.only.empty() && std::none_of(opt_.only.begin(), opt_.only.end(), [&](const auto& t) {
          return name.find(t) != std::string::npos;
        }))
      return;
    MPI_Comm world = mesh.comm();
    const Source x = gshard::random_uniform<Source>(mesh, std::move(shape), 42, -1.0f, 1.0f);
    Target y_into = gshard::reshard<Target>(x);  // the reused storage, touched once
    Raw raw;
    raw.in = host_buffer(x.local_view());
    make_raw(raw);

    // Correctness, once: gshard against to_global of the source, the reference against gshard.
    {
      const std::vector<float> want = x.to_global();
      const Target y = gshard::reshard<Target>(x);
      gshard::reshard_into(x, y_into);
      raw.program();
      const std::vector<float> local = host_copy(y.local_view());
      bool ok = y.to_global() == want && y_into.to_global() == want &&
                host_copy(y_into.local_view()) == local && raw.out.values() == local;
      int all = ok ? 1 : 0;
      MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_MIN, world);
      if (all == 0) {
        if (rank_ == 0)
          std::fprintf(stderr, "bench_reshard: WRONG result for %s \"%s\" -> \"%s\"\n",
                       transition.c_str(), std::string(Source::spec_string()).c_str(),
                       std::string(Target::spec_string()).c_str());
        failed_ = true;
        return;
      }
    }

    const bool packs = split != "outer";
    std::vector<std::function<void()>> variants = {
        raw.collective,
        [&] { const Target y = gshard::reshard<Target>(x); },
        [&] { gshard::reshard_into(x, y_into); },
        [&] { const auto plan = gshard::plan_reshard<Target>(x); },
    };
    if (packs) variants.push_back(raw.program);
    std::vector<std::vector<double>> times(variants.size());
    std::vector<std::vector<double>> faults(variants.size());
    const std::size_t nv = variants.size();
    for (int w = 0; w < opt_.warmup; ++w)
      for (auto& f : variants) timed(world, f);
    // A new order each repetition (the same on every rank): no variant always runs first or
    // after the same one. A fixed rotation had the hand-written program always follow the plan
    // (no communication), so on a link shaped by a token bucket it always found the bucket full.
    std::vector<std::size_t> order(nv);
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::mt19937 shuffle(12345);
    for (int r = 0; r < opt_.reps; ++r) {
      std::shuffle(order.begin(), order.end(), shuffle);
      for (const std::size_t which : order) {
        const Sample t = timed(world, variants[which]);
        times[which].push_back(t.seconds);
        faults[which].push_back(t.faults);
      }
    }

    Result res;
    res.transition = transition;
    res.collective = collective;
    res.source = std::string(Source::spec_string());
    res.target = std::string(Target::spec_string());
    res.split = split;
    res.ranks = size_;
    res.group = gshard::detail::group_size(mesh.group(mask));
    res.payload = static_cast<std::int64_t>(raw.in.size() * sizeof(float));
    res.reps = opt_.reps;
    res.mpi_us = 1e6 * median(times[0]);
    res.gshard_us = 1e6 * median(times[1]);
    res.into_us = 1e6 * median(times[2]);
    res.plan_us = 1e6 * median(times[3]);
    res.ref_us = packs ? 1e6 * median(times[4]) : res.mpi_us;
    res.ref_faults = median(faults[packs ? 4 : 0]);
    res.gshard_faults = median(faults[1]);
    res.into_faults = median(faults[2]);
    if (rank_ == 0) print(res);
    results_.push_back(res);
  }

  void note(const std::string& text) {
    if (rank_ == 0) std::printf("note: %s\n", text.c_str());
    notes_.push_back(text);
  }

  void header() const {
    if (rank_ != 0) return;
    std::printf(
        "bench_reshard: %d rank(s), float, %d reps (median of max over ranks), %d warm-up\n", size_,
        opt_.reps, opt_.warmup);
    std::printf("%-18s %-5s %-15s %-15s %8s %10s %10s %10s %10s %7s %7s  %s\n", "transition",
                "split", "source", "target", "payload", "mpi_us", "ref_us", "gshard_us", "into_us",
                "ratio", "r_into", "faults ref/gshard/into");
  }

  void write_csv() const {
    if (rank_ != 0) return;
    std::FILE* f = std::fopen(opt_.csv.c_str(), "w");
    if (f == nullptr) throw std::runtime_error("bench_reshard: cannot write " + opt_.csv);
    std::fprintf(f,
                 "ranks,transition,collective,source,target,split,group,payload_bytes,reps,"
                 "mpi_us,ref_us,gshard_us,into_us,plan_us,ratio,ratio_into,"
                 "ref_faults,gshard_faults,into_faults\n");
    for (const Result& r : results_)
      std::fprintf(f,
                   "%d,%s,%s,\"%s\",\"%s\",%s,%d,%lld,%d,%.1f,%.1f,%.1f,%.1f,%.2f,%.3f,%.3f,%.0f,"
                   "%.0f,%.0f\n",
                   r.ranks, r.transition.c_str(), r.collective.c_str(), r.source.c_str(),
                   r.target.c_str(), r.split.c_str(), r.group, static_cast<long long>(r.payload),
                   r.reps, r.mpi_us, r.ref_us, r.gshard_us, r.into_us, r.plan_us,
                   r.ref_us / r.gshard_us, r.ref_us / r.into_us, r.ref_faults, r.gshard_faults,
                   r.into_faults);
    for (const std::string& n : notes_) std::fprintf(f, "# note: %s\n", n.c_str());
    std::fclose(f);
    std::printf("wrote %s\n", opt_.csv.c_str());
  }

  [[nodiscard]] bool failed() const { return failed_; }
  [[nodiscard]] const Options& options() const { return opt_; }

 private:
  struct Sample {
    double seconds;
    double faults;
  };
  static long minor_faults() {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
  }
  // One barrier-synchronised call: its time and minor page faults, each the maximum over ranks.
  static Sample timed(MPI_Comm comm, const std::function<void()>& f) {
    const long faults0 = minor_faults();
    MPI_Barrier(comm);
    const double t0 = MPI_Wtime();
    f();
    const double dt = MPI_Wtime() - t0;
    double v[2] = {dt, static_cast<double>(minor_faults() - faults0)};
    MPI_Allreduce(MPI_IN_PLACE, v, 2, MPI_DOUBLE, MPI_MAX, comm);
    return {v[0], v[1]};
  }

  static void print(const Result& r) {
    char payload[32];
    std::snprintf(payload, sizeof payload, "%lldKiB", static_cast<long long>(r.payload / 1024));
    std::printf(
        "%-18s %-5s %-15s %-15s %8s %10.1f %10.1f %10.1f %10.1f %7.3f %7.3f  %.0f/%.0f/%.0f\n",
        r.transition.c_str(), r.split.c_str(), ("\"" + r.source + "\"").c_str(),
        ("\"" + r.target + "\"").c_str(), payload, r.mpi_us, r.ref_us, r.gshard_us, r.into_us,
        r.ref_us / r.gshard_us, r.ref_us / r.into_us, r.ref_faults, r.gshard_faults, r.into_faults);
    std::fflush(stdout);
  }

  Options opt_;
  int rank_, size_;
  bool failed_ = false;
  std::vector<Result> results_;
  std::vector<std::string> notes_;
};

constexpr std::size_t u(std::int64_t v) { return static_cast<std::size_t>(v); }
int count(std::int64_t v) { return gshard::detail::mpi_count(v, "bench_reshard"); }

/// dst[i * dst_ld + j] = src[i * src_ld + j] for i < rows, j < cols.
void copy_rows(const float* src, std::int64_t src_ld, float* dst, std::int64_t dst_ld,
               std::int64_t rows, std::int64_t cols) {
  for (std::int64_t i = 0; i < rows; ++i)
    std::memcpy(dst + i * dst_ld, src + i * src_ld, u(cols) * sizeof(float));
}

void run_all(Bench& bench, int size) {
  const Line line(MPI_COMM_WORLD, {size});
  const int k = size;
  const int me = line.coordinate(0);
  MPI_Comm g = line.group(1u);
  const std::int64_t c = row / k;  // columns of a block split over x
  for (int mib : bench.options().sizes_mib) {
    const std::int64_t p = std::int64_t{mib} * 1024 * 1024 / std::int64_t{sizeof(float)};
    const std::int64_t r = p / row;  // rows of a [r, row] block of p floats
    if (r % k != 0 || row % k != 0) {
      bench.note("payload " + std::to_string(mib) + " MiB does not divide over " +
                 std::to_string(k) + " ranks; skipped");
      continue;
    }

    // split -> replicated: AllGather.
    bench.run<LineReplicated, LineRows>(line, "AllGather", "MPI_Allgather", "outer", 1u,
                                        {k * r, row}, [&](Raw& raw) {
                                          raw.out.assign(k * p);
                                          raw.collective = [&raw, g, p] {
                                            MPI_Allgather(raw.in.data(), count(p), MPI_FLOAT,
                                                          raw.out.data(), count(p), MPI_FLOAT, g);
                                          };
                                          raw.program = raw.collective;
                                        });
    bench.run<LineReplicated, LineColumns>(
        line, "AllGather", "MPI_Allgather", "inner", 1u, {p / c, row}, [&](Raw& raw) {
          // Local [p/c, c]; gathered pieces land side by side along B.
          raw.out.assign(k * p);
          raw.scratch.assign(k * p);
          raw.collective = [&raw, g, p] {
            MPI_Allgather(raw.in.data(), count(p), MPI_FLOAT, raw.scratch.data(), count(p),
                          MPI_FLOAT, g);
          };
          raw.program = [&raw, p, k, c] {
            raw.collective();
            for (int j = 0; j < k; ++j)
              copy_rows(raw.scratch.data() + j * p, c, raw.out.data() + j * c, row, p / c, c);
          };
        });

    // replicated -> split: a local slice, no communication. Reference: memcpy of the block.
    bench.run<LineRows, LineReplicated>(
        line, "slice (local)", "memcpy", "outer", 0u, {r, row}, [&](Raw& raw) {
          raw.out.assign(p / k);
          raw.collective = [&raw, p, k, me] {
            std::memcpy(raw.out.data(), raw.in.data() + me * (p / k), u(p / k) * sizeof(float));
          };
          raw.program = raw.collective;
        });
    bench.run<LineColumns, LineReplicated>(
        line, "slice (local)", "memcpy", "inner", 0u, {r, row}, [&](Raw& raw) {
          raw.out.assign(p / k);
          raw.collective = [&raw, p, k] {
            std::memcpy(raw.out.data(), raw.in.data(), u(p / k) * sizeof(float));
          };
          raw.program = [&raw, r, c, me] {
            copy_rows(raw.in.data() + me * c, row, raw.out.data(), c, r, c);
          };
        });

    // split X -> split Y on one axis: AllToAll. Either way one side needs packing.
    bench.run<LineColumns, LineRows>(
        line, "AllToAll", "MPI_Alltoall", "inner", 1u, {k * r, row}, [&](Raw& raw) {
          // Local [r, row] -> pieces [r, c] for each member (pack), received rows are contiguous.
          raw.out.assign(p);
          raw.scratch.assign(p);
          raw.collective = [&raw, g, p, k] {
            MPI_Alltoall(raw.scratch.data(), count(p / k), MPI_FLOAT, raw.out.data(), count(p / k),
                         MPI_FLOAT, g);
          };
          raw.program = [&raw, r, k, c] {
            for (int j = 0; j < k; ++j)
              copy_rows(raw.in.data() + j * c, row, raw.scratch.data() + j * r * c, c, r, c);
            raw.collective();
          };
        });
    bench.run<LineRows, LineColumns>(
        line, "AllToAll", "MPI_Alltoall", "inner", 1u, {k * r, row}, [&](Raw& raw) {
          // Local [k*r, c]: pieces are contiguous row blocks; received pieces go side by side.
          raw.out.assign(p);
          raw.scratch.assign(p);
          raw.collective = [&raw, g, p, k] {
            MPI_Alltoall(raw.in.data(), count(p / k), MPI_FLOAT, raw.scratch.data(), count(p / k),
                         MPI_FLOAT, g);
          };
          raw.program = [&raw, r, k, c] {
            raw.collective();
            for (int j = 0; j < k; ++j)
              copy_rows(raw.scratch.data() + j * r * c, c, raw.out.data() + j * c, row, r, c);
          };
        });

    // partial -> replicated: AllReduce.
    bench.run<LineReplicated, LinePartial>(
        line, "AllReduce", "MPI_Allreduce", "outer", 1u, {r, row}, [&](Raw& raw) {
          raw.out.assign(p);
          raw.collective = [&raw, g, p] {
            MPI_Allreduce(raw.in.data(), raw.out.data(), count(p), MPI_FLOAT, MPI_SUM, g);
          };
          raw.program = raw.collective;
        });

    // partial -> split: ReduceScatter.
    bench.run<LineRows, LinePartial>(
        line, "ReduceScatter", "MPI_Reduce_scatter_block", "outer", 1u, {r, row}, [&](Raw& raw) {
          raw.out.assign(p / k);
          raw.collective = [&raw, g, p, k] {
            MPI_Reduce_scatter_block(raw.in.data(), raw.out.data(), count(p / k), MPI_FLOAT,
                                     MPI_SUM, g);
          };
          raw.program = raw.collective;
        });
    bench.run<LineColumns, LinePartial>(
        line, "ReduceScatter", "MPI_Reduce_scatter_block", "inner", 1u, {r, row}, [&](Raw& raw) {
          raw.out.assign(p / k);
          raw.scratch.assign(p);
          raw.collective = [&raw, g, p, k] {
            MPI_Reduce_scatter_block(raw.scratch.data(), raw.out.data(), count(p / k), MPI_FLOAT,
                                     MPI_SUM, g);
          };
          raw.program = [&raw, r, k, c] {
            for (int j = 0; j < k; ++j)
              copy_rows(raw.in.data() + j * c, row, raw.scratch.data() + j * r * c, c, r, c);
            raw.collective();
          };
        });
  }

  // split on axis a -> the same dimension on axis b: CollectivePermute on an m x m mesh.
  int m = 1;
  while ((m + 1) * (m + 1) <= size) ++m;
  if (m * m != size || m < 2) {
    bench.note("CollectivePermute needs a square mesh (4, 9, ... ranks); skipped on " +
               std::to_string(size) + " rank(s)");
    return;
  }
  const Grid grid(MPI_COMM_WORLD, {m, m});
  MPI_Comm gg = grid.group(3u);
  const int partner = grid.coordinate(1) * m + grid.coordinate(0);  // a and b swapped
  for (int mib : bench.options().sizes_mib) {
    const std::int64_t p = std::int64_t{mib} * 1024 * 1024 / std::int64_t{sizeof(float)};
    const std::int64_t r = p / row;
    bench.run<GridRowsOverB, GridRowsOverA>(
        grid, "CollectivePermute", "MPI_Sendrecv", "outer", 3u, {m * r, row}, [&](Raw& raw) {
          raw.out.assign(p);
          raw.collective = [&raw, gg, p, partner] {
            MPI_Sendrecv(raw.in.data(), count(p), MPI_FLOAT, partner, 0, raw.out.data(), count(p),
                         MPI_FLOAT, partner, 0, gg, MPI_STATUS_IGNORE);
          };
          raw.program = raw.collective;
        });
  }
}

}  // namespace

int main(int argc, char** argv) {
  gshard::Environment env(argc, argv);  // malloc left alone: the bench pins its threshold below
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int status = 0;
  try {
    Bench bench(parse(argc, argv), rank, size);
#if defined(__GLIBC__)
    // glibc raises its mmap threshold whenever an mmapped block is freed, so whether a large
    // malloc (gshard's results, MPI's own temporary buffers) comes with fresh pages to fault in
    // depends on what ran before: a case's timings would depend on the previous case. Pinning
    // the threshold at its initial 128 KiB makes every large allocation fresh and every run
    // alike; both sides are affected the same way except `reshard`, which allocates its result.
    if (!bench.options().dynamic_mmap) mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
    bench.header();
    run_all(bench, size);
    bench.write_csv();
    status = bench.failed() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_reshard (rank %d): %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return status;
}
