// expect-error: unknown_mesh_axis<gshard::literal<6>{"exprt"}
// A spec names a mesh axis the Mesh does not have (a typo of "expert").
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G:exprt S M">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
