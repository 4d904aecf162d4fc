// expect-error: checkpoint_block_must_return_one_tensor<std::tuple<
// A checkpointed block returning two tensors: checkpoint rematerialises one value.
#include <gshard/gshard.hpp>

#include <tuple>

using M = gshard::Mesh<"x">;
using H = gshard::Sharded<float, M, "B D:x">;

auto bad(const H& h) {
  return gshard::checkpoint([](const H& x) { return std::make_tuple(x, x); }, h);
}

int main() { return 0; }
