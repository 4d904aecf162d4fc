// expect-error: mesh_axis_used_twice<gshard::literal<5>{"data"}
// One mesh axis holds the partial sum twice.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G S +data +data">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
