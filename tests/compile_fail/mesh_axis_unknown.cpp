// expect-error: no_axis_named<gshard::literal<7>{"expret"}, gshard::Mesh<
// Mesh::axis<"name">() with a name the mesh does not have (a typo of "expert").
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;

int main() { return M::axis<"expret">(); }
