// bench_alltoall_2dh: Tutel's hierarchical ("2DH") AllToAllv (detail::all_to_all_v_hierarchical)
// against the flat one (detail::all_to_all_v, one MPI_Alltoallv) on an emulated two-level mesh:
// the world's ranks as Mesh<"node", "local"> of each listed shape (e.g. 8 ranks as 2x4 and 4x2),
// the same uniform piece of S bytes from every rank to every rank.
//
// For each shape and S the bench times, interleaved and after a warm-up, one exchange each way;
// each repetition is barrier-synchronised and its time is the maximum over the ranks; the table
// shows medians. Messages and bytes per rank come from comm_counters(), per step; the inter-node
// messages are those whose peer is on another "node". Both results are compared element for
// element once per case, so the bench cannot time garbage.
//
// All ranks of a run share one machine here: "inter-node" costs what intra-node does, so the
// table shows the price of 2DH's extra copy and step more than its saving in inter-node
// latency (docs/design.md, "Hierarchical AllToAll (Tutel 2DH)").
//
// Usage: mpirun -n P bench_alltoall_2dh [--csv PATH] [--reps N] [--warmup N]
//                                       [--sizes 1,4,16,64,256,1024,4096] (KiB per pair)
//                                       [--shapes 2x4,4x2] (node x local; default: every
//                                       factorisation of P with both factors above 1)
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <gshard/comm/hierarchical.hpp>
#include <gshard/mesh/mesh.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

using bench::median, bench::split;

using gshard::Collective;
using gshard::comm_counters;
using Nodes = gshard::Mesh<"node", "local">;

struct Options {
  std::string csv;
  int reps = 11;
  int warmup = 2;
  std::vector<int> sizes_kib = {1, 4, 16, 64, 256, 1024, 4096};
  std::vector<std::pair<int, int>> shapes;  // node x local
};

Options parse(int argc, char** argv, int ranks) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error("bench_alltoall_2dh: " + a + " needs a value");
      return argv[++i];
    };
    if (a == "--csv") {
      o.csv = value();
    } else if (a == "--reps") {
      o.reps = std::stoi(value());
    } else if (a == "--warmup") {
      o.warmup = std::stoi(value());
    } else if (a == "--sizes") {
      o.sizes_kib.clear();
      for (const std::string& s : split(value(), ',')) o.sizes_kib.push_back(std::stoi(s));
    } else if (a == "--shapes") {
      for (const std::string& s : split(value(), ',')) {
        const auto parts = split(s, 'x');
        if (parts.size() != 2) throw std::runtime_error("bench_alltoall_2dh: shape " + s);
        o.shapes.emplace_back(std::stoi(parts[0]), std::stoi(parts[1]));
      }
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_alltoall_2dh [--csv PATH] [--reps N] [--warmup N] "
          "[--sizes 1,4,...,4096 (KiB per pair)] [--shapes 2x4,4x2 (node x local)]\n");
      std::exit(0);
    } else {
      throw std::runtime_error("bench_alltoall_2dh: unknown option " + a);
    }
  }
  if (o.shapes.empty())
    for (int n = 2; n < ranks; ++n)
      if (ranks % n == 0) o.shapes.emplace_back(n, ranks / n);
  for (const auto& [n, l] : o.shapes)
    if (n * l != ranks)
      throw std::runtime_error("bench_alltoall_2dh: shape " + std::to_string(n) + "x" +
                               std::to_string(l) + " does not have " + std::to_string(ranks) +
                               " ranks");
  return o;
}

/// The slowest rank's time of f, after a barrier.
template <class F>
double timed(MPI_Comm comm, F&& f) {
  MPI_Barrier(comm);
  const double t0 = MPI_Wtime();
  f();
  double dt = MPI_Wtime() - t0;
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, comm);
  return dt;
}

struct Row {
  int nodes = 0, local = 0;
  std::int64_t pair_bytes = 0;
  double flat_us = 0, hier_us = 0;
  // Per rank: messages to other ranks and bytes sent, per step.
  int flat_msgs = 0, flat_inter_msgs = 0;
  std::int64_t flat_bytes = 0;
  int step1_msgs = 0, step2_msgs = 0;
  std::int64_t step1_bytes = 0, step2_bytes = 0, counts_bytes = 0;
};

Row run_case(const Nodes& mesh, std::int64_t pair_bytes, const Options& opt) {
  const int n = mesh.axis_size(0);
  const int l = mesh.axis_size(1);
  const int p = n * l;
  const int me = mesh.rank();
  const MPI_Comm flat = mesh.group(3);
  const std::int64_t count = pair_bytes / static_cast<std::int64_t>(sizeof(float));
  std::vector<int> counts(static_cast<std::size_t>(p), static_cast<int>(count));
  std::vector<int> displs(static_cast<std::size_t>(p));
  for (int j = 0; j < p; ++j) displs[j] = static_cast<int>(j * count);
  std::vector<float> send(static_cast<std::size_t>(p * count));
  for (std::size_t i = 0; i < send.size(); ++i)
    send[i] = static_cast<float>((me * 7919 + i) % 4093);
  std::vector<float> flat_recv(send.size());
  std::vector<float> hier_recv(send.size());
  std::fill(flat_recv.begin(), flat_recv.end(), -1.0f);
  std::fill(hier_recv.begin(), hier_recv.end(), -2.0f);

  auto flat_exchange = [&] {
    gshard::detail::all_to_all_v(send.data(), counts, displs, flat_recv.data(), counts, displs,
                                 flat, "node*local");
  };
  auto hier_exchange = [&] {
    gshard::detail::all_to_all_v_hierarchical(send.data(), counts, displs, hier_recv.data(), counts,
                                              displs, mesh.group(2), mesh.group(1), "local",
                                              "node");
  };

  Row r;
  r.nodes = n;
  r.local = l;
  r.pair_bytes = pair_bytes;
  comm_counters().reset();
  flat_exchange();
  hier_exchange();
  const gshard::CommCounters& c = comm_counters();
  r.flat_msgs = p - 1;
  r.flat_inter_msgs = p - l;
  r.flat_bytes = c.get("node*local", Collective::all_to_all_v).bytes;
  r.step1_msgs = l - 1;
  r.step2_msgs = n - 1;
  r.step1_bytes = c.get("local", Collective::all_to_all_v).bytes;
  r.step2_bytes = c.get("node", Collective::all_to_all_v).bytes;
  r.counts_bytes = c.get("local", Collective::all_to_all).bytes;
  int wrong = flat_recv != hier_recv ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &wrong, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (wrong != 0) {
    if (me == 0)
      std::fprintf(stderr, "bench_alltoall_2dh: WRONG hierarchical result on %dx%d, %lld B\n", n, l,
                   static_cast<long long>(pair_bytes));
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  for (int i = 0; i < opt.warmup; ++i) {
    flat_exchange();
    hier_exchange();
  }
  std::vector<double> flat_t, hier_t;
  for (int i = 0; i < opt.reps; ++i) {  // interleaved, so drifting load hits both alike
    flat_t.push_back(timed(MPI_COMM_WORLD, flat_exchange));
    hier_t.push_back(timed(MPI_COMM_WORLD, hier_exchange));
  }
  r.flat_us = median(flat_t) * 1e6;
  r.hier_us = median(hier_t) * 1e6;
  return r;
}

std::string size_text(std::int64_t bytes) {
  return bytes >= 1 << 20 ? std::to_string(bytes >> 20) + " MiB"
                          : std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int ranks = 1, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int rc = 0;
  try {
    const Options opt = parse(argc, argv, ranks);
    std::vector<Row> rows;
    for (const auto& [n, l] : opt.shapes) {
      const Nodes mesh(MPI_COMM_WORLD, {n, l});
      for (const int kib : opt.sizes_kib)
        rows.push_back(run_case(mesh, std::int64_t{kib} * 1024, opt));
    }
    if (rank == 0) {
      std::printf(
          "| node x local | per pair | flat µs | 2DH µs | flat/2DH | flat msgs/rank (inter) | "
          "2DH msgs/rank: step 1 + step 2 (inter) | flat bytes/rank | 2DH bytes/rank: step 1 + "
          "step 2 |\n|---|---|---|---|---|---|---|---|---|\n");
      for (const Row& r : rows)
        std::printf(
            "| %dx%d | %s | %.1f | %.1f | %.2f | %d (%d) | %d + %d (%d) | %lld | %lld + %lld |\n",
            r.nodes, r.local, size_text(r.pair_bytes).c_str(), r.flat_us, r.hier_us,
            r.flat_us / r.hier_us, r.flat_msgs, r.flat_inter_msgs, r.step1_msgs, r.step2_msgs,
            r.step2_msgs, static_cast<long long>(r.flat_bytes),
            static_cast<long long>(r.step1_bytes), static_cast<long long>(r.step2_bytes));
      std::printf(
          "\n%d ranks on one machine (the two levels are emulated); median of %d repetitions, each "
          "the slowest rank's time; 2DH also sends (local-1)*node*4 B of counts per rank first "
          "(one AllToAll within the node).\n",
          ranks, opt.reps);
      if (!opt.csv.empty()) {
        std::FILE* f = std::fopen(opt.csv.c_str(), "w");
        if (f == nullptr) throw std::runtime_error("bench_alltoall_2dh: cannot write " + opt.csv);
        std::fprintf(f,
                     "nodes,local,pair_bytes,flat_us,hier_us,flat_msgs,flat_inter_msgs,step1_msgs,"
                     "step2_msgs,flat_bytes,step1_bytes,step2_bytes,counts_bytes\n");
        for (const Row& r : rows)
          std::fprintf(f, "%d,%d,%lld,%.3f,%.3f,%d,%d,%d,%d,%lld,%lld,%lld,%lld\n", r.nodes,
                       r.local, static_cast<long long>(r.pair_bytes), r.flat_us, r.hier_us,
                       r.flat_msgs, r.flat_inter_msgs, r.step1_msgs, r.step2_msgs,
                       static_cast<long long>(r.flat_bytes), static_cast<long long>(r.step1_bytes),
                       static_cast<long long>(r.step2_bytes),
                       static_cast<long long>(r.counts_bytes));
        std::fclose(f);
      }
    }
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "%s\n", e.what());
    rc = 1;
  }
  MPI_Finalize();
  return rc;
}
