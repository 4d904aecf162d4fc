// The 2-D heat equation on a plate, explicit in time (5-point Jacobi sweeps), on a 2-D mesh of
// ranks: the grid is a Sharded<double, Mesh<"y", "x">, "I:y J:x"> (any sizes, uneven blocks
// included), its ghost cells come from gshard::HaloField, the initial field is read from HDF5
// and snapshots are written to HDF5, collectively; rank 0 draws the final field as a PNG.
//
//   mpirun -n 4 heat2d --ny 1024 --nx 1024 --steps 500 --out heat2d_out
//   mpirun -n 4 heat2d --input plate.h5 --dataset u       # any 2-D float64 dataset
//
// Without --input it writes its initial field (two warm discs) to OUT/initial.h5 first and reads
// it from there. --check compares the result with a one-rank loop over the whole grid, bit for
// bit (small grids). Outputs: OUT/snapshots.h5 (u/step_NNNNNN), OUT/final.png.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <gshard/io/hdf5.hpp>
#include <gshard/tensor.hpp>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "../cli.hpp"
#include "jacobi.hpp"
#include "png.hpp"

namespace {

using Mesh = gshard::Mesh<"y", "x">;
using Grid = gshard::Sharded<double, Mesh, "I:y J:x">;

struct Options {
  std::int64_t ny = 256, nx = 256;
  int steps = 200;
  int snapshot_every = 100;
  double r = 0.2;  // dt * diffusivity / h^2; explicit stability needs r <= 0.25
  double edge = 0.0;
  std::string mesh, input, dataset = "u", out = "heat2d_out";
  bool check = false;
};

// The initial temperatures of a block starting at global (i0, j0). Its own function: nvcc cannot
// name a device lambda inside a function whose signature names a spec (docs/backends.md).
void fill_initial(const Kokkos::View<double**>& v, std::int64_t i0, std::int64_t j0,
                  std::int64_t ny, std::int64_t nx) {
  Kokkos::parallel_for(
      "initial", Kokkos::MDRangePolicy<Kokkos::Rank<2>>({0, 0}, {v.extent(0), v.extent(1)}),
      KOKKOS_LAMBDA(const std::size_t i, const std::size_t j) {
        v(i, j) = heat2d::initial(i0 + static_cast<std::int64_t>(i),
                                  j0 + static_cast<std::int64_t>(j), ny, nx);
      });
}

// The initial field as a tensor: each rank fills its own block in a View that becomes the shard.
Grid initial_field(const Mesh& mesh, std::int64_t ny, std::int64_t nx) {
  const gshard::LocalBlock b = gshard::local_block<Grid>(mesh, {ny, nx});
  Kokkos::View<double**> v("initial", b.extents[0], b.extents[1]);
  fill_initial(v, b.offsets[0], b.offsets[1], ny, nx);
  return gshard::adopt<Grid>(mesh, {ny, nx}, v);
}

// The whole computation on one rank, as plain loops: what --check compares with.
std::vector<double> one_rank_reference(std::vector<double> u, std::int64_t ny, std::int64_t nx,
                                       const Options& o) {
  std::vector<double> v(u.size());
  auto at = [&](std::int64_t i, std::int64_t j) {
    return i < 0 || j < 0 || i >= ny || j >= nx ? o.edge : u[static_cast<std::size_t>(i * nx + j)];
  };
  for (int s = 0; s < o.steps; ++s) {
    for (std::int64_t i = 0; i < ny; ++i)
      for (std::int64_t j = 0; j < nx; ++j)
        v[static_cast<std::size_t>(i * nx + j)] =
            heat2d::update(at(i, j), at(i - 1, j), at(i + 1, j), at(i, j - 1), at(i, j + 1), o.r);
    std::swap(u, v);
  }
  return u;
}

// At most 512 pixels a side, each the mean of the cells it covers; colours scaled to [0, max].
void draw(const std::vector<double>& u, std::int64_t ny, std::int64_t nx, const std::string& path) {
  const std::int64_t step = std::max<std::int64_t>(1, (std::max(ny, nx) + 511) / 512);
  const int h = static_cast<int>((ny + step - 1) / step),
            w = static_cast<int>((nx + step - 1) / step);
  const double top = std::max(1e-12, *std::max_element(u.begin(), u.end()));
  std::vector<std::uint8_t> rgb;
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x) {
      double sum = 0;
      int count = 0;
      for (std::int64_t i = y * step; i < std::min(ny, (y + 1) * step); ++i)
        for (std::int64_t j = x * step; j < std::min(nx, (x + 1) * step); ++j, ++count)
          sum += u[static_cast<std::size_t>(i * nx + j)];
      const auto c = heat2d::heat_colour(sum / count / top);
      rgb.insert(rgb.end(), c.begin(), c.end());
    }
  heat2d::write_png(path, w, h, rgb);
}

int run(const Options& o) {
  int ranks = 1, me = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  const auto [py, px] = hpc::grid_shape(o.mesh, ranks, "--mesh");
  const Mesh mesh(MPI_COMM_WORLD, {py, px});
  namespace fs = std::filesystem;
  const fs::path out = o.out;
  if (me == 0) {
    fs::create_directories(out);
    fs::remove(out / "snapshots.h5");
  }
  MPI_Barrier(MPI_COMM_WORLD);

  std::string input = o.input;
  if (input.empty()) {
    input = (out / "initial.h5").string();
    if (me == 0) fs::remove(input);
    MPI_Barrier(MPI_COMM_WORLD);
    gshard::io::save_hdf5(input, o.dataset, initial_field(mesh, o.ny, o.nx));
  }
  const Grid u0 = gshard::io::load_hdf5<Grid>(mesh, input, o.dataset);
  const std::int64_t ny = u0.shape()[0], nx = u0.shape()[1];
  if (me == 0)
    std::cout << "heat2d: " << ny << " x " << nx << " grid from " << input << ":" << o.dataset
              << " on " << mesh.describe() << ", " << o.steps << " steps, r = " << o.r << "\n";

  gshard::HaloField<Grid> a(mesh, u0.shape(), {}, o.edge), b(mesh, u0.shape(), {}, o.edge);
  a.assign(u0);
  const std::string snapshots = (out / "snapshots.h5").string();
  double computing = 0;
  for (int step = 1; step <= o.steps; ++step) {
    const double t0 = MPI_Wtime();
    a.exchange();
    heat2d::sweep(a.view(), b.view(), a.extents()[0], a.extents()[1], o.r);
    std::swap(a, b);
    Kokkos::fence();
    computing += MPI_Wtime() - t0;
    if ((o.snapshot_every > 0 && step % o.snapshot_every == 0) || step == o.steps) {
      char name[32];
      std::snprintf(name, sizeof name, "u/step_%06d", step);
      gshard::io::save_hdf5(snapshots, name, a.tensor());
    }
  }
  MPI_Allreduce(MPI_IN_PLACE, &computing, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  const Grid u = a.tensor();
  // What was written is what was computed: the last snapshot read back on the same mesh.
  char last[32];
  std::snprintf(last, sizeof last, "u/step_%06d", o.steps);
  const std::vector<double> final_values = u.gather_to_root(0);
  const std::vector<double> reread =
      gshard::io::load_hdf5<Grid>(mesh, snapshots, last).gather_to_root(0);
  const std::vector<double> start = u0.gather_to_root(0);
  int failed = 0;
  if (me == 0) {
    double heat = 0;
    for (double v : final_values) heat += v;
    std::printf("heat2d: %.3f s sweeping, %.1f sweeps/s, %.1f Mcell/s; total heat %.6f\n",
                computing, o.steps / computing,
                static_cast<double>(ny * nx) * o.steps / computing / 1e6, heat);
    if (reread != final_values) {
      std::cout << "heat2d: FAILED: the last snapshot read back differs from the field\n";
      failed = 1;
    }
    draw(final_values, ny, nx, (out / "final.png").string());
    std::cout << "heat2d: wrote " << snapshots << " and " << (out / "final.png").string() << "\n";
    if (o.check) {
      const bool equal = one_rank_reference(start, ny, nx, o) == final_values;
      std::cout << "heat2d: check against a one-rank loop: "
                << (equal ? "bitwise equal" : "FAILED: differs") << "\n";
      failed |= equal ? 0 : 1;
    }
  }
  MPI_Bcast(&failed, 1, MPI_INT, 0, MPI_COMM_WORLD);
  return failed;
}

}  // namespace

int main(int argc, char** argv) {
  gshard::Environment env(argc, argv);
  Options o;
  CLI::App app("2-D heat equation (Jacobi sweeps) with gshard's halo exchange and HDF5 I/O");
  app.add_option("--ny", o.ny, "grid rows (without --input)");
  app.add_option("--nx", o.nx, "grid columns (without --input)");
  app.add_option("--steps", o.steps, "time steps");
  app.add_option("--snapshot-every", o.snapshot_every, "steps between snapshots");
  app.add_option("--r", o.r, "dt * diffusivity / h^2 (<= 0.25)");
  app.add_option("--edge", o.edge, "temperature past the plate's edge");
  app.add_option("--mesh", o.mesh, "ranks as PxQ (default: as square as possible)");
  app.add_option("--input", o.input, "HDF5 file with the initial field");
  app.add_option("--dataset", o.dataset, "its dataset");
  app.add_option("--out", o.out, "output directory");
  app.add_flag("--check", o.check, "compare with a one-rank loop, bit for bit");
  return hpc::parse_and_run(app, argc, argv, "heat2d", [&] { return run(o); });
}
