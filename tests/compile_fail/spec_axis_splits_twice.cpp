// expect-error: mesh_axis_used_twice<gshard::literal<5>{"data"}
// One mesh axis splits two dimensions.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G:data S:data">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
