// The smallest useful gshard program: a mesh, two sharded tensors, one einsum. compile_times.py
// parses it (-fsyntax-only: templates instantiated, no code generated) with the header named by
// GSHARD_PROBE_HEADER, e.g. <gshard/einsum.hpp> or <gshard/gshard.hpp>.
#include GSHARD_PROBE_HEADER

int main(int argc, char** argv) {
  namespace gs = gshard;
  gs::Environment env(argc, argv);
  using M = gs::Mesh<"x", "y">;
  const M mesh(MPI_COMM_WORLD, {1, 1});
  using A = gs::Sharded<float, M, "I:x K">;
  using B = gs::Sharded<float, M, "K J:y">;
  const auto a = gs::random_uniform<A>(mesh, {64, 32}, 1);
  const auto b = gs::random_uniform<B>(mesh, {32, 16}, 2);
  const gs::Sharded<float, M, "I:x J:y"> c = gs::einsum<"IK,KJ->IJ">(a, b);
  return c.to_global().empty() ? 1 : 0;
}
