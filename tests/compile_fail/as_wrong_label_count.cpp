// expect-error: gshard .as<"...">(): give one new label per dimension
// .as<"AB">() on a three-dimensional tensor: one new label per dimension.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using X = gshard::Sharded<float, M, "G:data S M">;

auto bad(const X& x) { return x.as<"AB">(); }

int main() { return 0; }
