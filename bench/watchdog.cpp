// What the collective watchdog (comm/watchdog.hpp) costs: an 8-byte AllReduce, the latency-bound
// worst case, by plain MPI_Allreduce and by gshard's all_reduce with the watchdog off and on, and
// a small reshard whose AllReduce runs inside an op (so the report also names the op and its
// layouts), off and on. Each way: --reps rounds of --calls calls, interleaved, median of the
// rounds' mean time per call (max over ranks).
//
//   mpirun -n 2 bench_watchdog [--reps 15] [--calls 2000]
#include <mpi.h>

#include <cstdio>
#include <functional>
#include <gshard/gshard.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

namespace gs = gshard;
using Line = gs::Mesh<"x">;
using Rows = gs::Sharded<double, Line, "I:x J">;
using Scalar = gs::Sharded<double, Line, "">;

double per_call(int calls, const std::function<void()>& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int i = 0; i < calls; ++i) f();
  double t = (MPI_Wtime() - t0) / calls;
  MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  gs::Environment env(argc, argv);
  int reps = 15, calls = 2000;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--reps" || a == "--calls") && i + 1 < argc) {
      (a == "--reps" ? reps : calls) = std::stoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_watchdog [--reps N] [--calls N]\n");
      return 2;
    }
  }
  int size = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const Line line(MPI_COMM_WORLD, {size});
  const Rows rows = gs::from_global<Rows>(line, {16, 4}, std::vector<double>(64, 1.0));
  double value = 1;
  const auto plain = [&] {
    MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  };
  const auto ours = [&] {
    gs::detail::all_reduce(&value, 1, gs::detail::ReduceOp::sum, MPI_COMM_WORLD, "x");
  };
  const auto reshard = [&] { (void)gs::reshard<Scalar>(gs::einsum<"IJ->">(rows)); };
  struct Way {
    const char* name;
    std::function<void()> f;
    double timeout;
    int base;  // the way it is compared with (-1: none)
    std::vector<double> t;
  };
  std::vector<Way> ways = {{"MPI_Allreduce, 8 bytes", plain, 0, -1, {}},
                           {"all_reduce, watchdog off", ours, 0, 0, {}},
                           {"all_reduce, watchdog on", ours, 600, 1, {}},
                           {"reshard (an einsum's partial sum), watchdog off", reshard, 0, -1, {}},
                           {"reshard (an einsum's partial sum), watchdog on", reshard, 600, 3, {}}};
  for (Way& w : ways) {  // warm-up
    gs::set_collective_timeout(w.timeout);
    per_call(calls / 10 + 1, w.f);
  }
  for (int r = 0; r < reps; ++r)
    for (Way& w : ways) {
      gs::set_collective_timeout(w.timeout);
      w.t.push_back(per_call(calls, w.f));
    }
  gs::set_collective_timeout(0);
  if (rank == 0) {
    std::printf(
        "bench_watchdog: %d rank(s), %d rounds of %d calls, median of the rounds' mean "
        "(max over ranks)\n\n| way | us per call | added to |\n|---|---|---|\n",
        size, reps, calls);
    for (const Way& w : ways) {
      const double us = 1e6 * bench::median(w.t);
      if (w.base < 0) {
        std::printf("| %s | %.2f | |\n", w.name, us);
      } else {
        const Way& b = ways[static_cast<std::size_t>(w.base)];
        std::printf("| %s | %.2f | %+.2f us (%+.1f%%) to %s |\n", w.name, us,
                    us - 1e6 * bench::median(b.t), 100 * (us / (1e6 * bench::median(b.t)) - 1),
                    b.name);
      }
    }
  }
  return 0;
}
