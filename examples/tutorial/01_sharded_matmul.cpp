// Tutorial, step 1 (docs/tutorial.md): a sharded matmul. The layouts of the operands are in their
// types; einsum infers the result's layout at compile time and inserts the collectives it needs.
// Checked against a naive loop over the gathered matrices.
// [setup]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <gshard/gshard.hpp>
#include <vector>

namespace gs = gshard;

int main(int argc, char** argv) {
  gs::Environment env(argc, argv);  // MPI and Kokkos, for the program's lifetime
  int ranks = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);

  using Mesh = gs::Mesh<"data", "model">;
  const int data = ranks % 2 == 0 ? ranks / 2 : ranks;  // 4 ranks: a 2 x 2 mesh
  const Mesh mesh(MPI_COMM_WORLD, {data, ranks / data});
  // [setup]

  // [local]
  using X = gs::Sharded<float, Mesh, "B:data M">;   // rows of the batch split over "data"
  using W = gs::Sharded<float, Mesh, "M H:model">;  // columns of the weights split over "model"
  const X x = gs::random_normal<X>(mesh, {1000, 64}, /*seed=*/1);  // 1000 rows: uneven blocks
  const W w = gs::random_normal<W>(mesh, {64, 96}, /*seed=*/2);
  const auto y = gs::einsum<"BM,MH->BH">(x, w).eval();            // each rank multiplies its blocks
  static_assert(decltype(y)::spec_string() == "B:data H:model");  // inferred, no collective
  // [local]

  // [partial]
  using Xm = gs::Sharded<float, Mesh, "B:data M:model">;  // now the contracted M is split
  using Wm = gs::Sharded<float, Mesh, "M:model H">;
  const Xm xm = x;                     // moves no data (each rank slices its part of M): implicit
  const auto wm = gs::reshard<Wm>(w);  // an AllToAll over "model": written out
  const auto partial = gs::einsum<"BM,MH->BH">(xm, wm);
  if (mesh.rank() == 0) std::printf("%s", gs::explain(partial).c_str());
  using Y = gs::Sharded<float, Mesh, "B:data H">;
  const Y z = partial;  // the pending sums over "model" are finished here: one AllReduce
  // [partial]

  // [check]
  // The reference: a naive loop over the whole matrices, on every rank. to_global() is
  // collective, so every rank calls it; only the printing is left to rank 0.
  const std::vector<float> xs = x.to_global(), ws = w.to_global();
  const std::vector<float> ys = y.to_global(), zs = z.to_global();
  double err = 0;
  for (int b = 0; b < 1000; ++b)
    for (int h = 0; h < 96; ++h) {
      double s = 0;
      for (int m = 0; m < 64; ++m) s += double(xs[b * 64 + m]) * ws[m * 96 + h];
      err = std::max({err, std::abs(ys[b * 96 + h] - s), std::abs(zs[b * 96 + h] - s)});
    }
  const bool ok = err < 1e-3;
  if (mesh.rank() == 0)
    std::printf("tutorial 1: y = x w on %s: max error %.3g: %s\n", mesh.describe().c_str(), err,
                ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
// [check]
