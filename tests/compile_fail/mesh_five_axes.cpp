// expect-error: mesh_needs_1_to_4_axes<5>
// A mesh with five axes; at most 4 are allowed.
#include <gshard/gshard.hpp>

using Bad = gshard::Mesh<"a", "b", "c", "d", "e">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
