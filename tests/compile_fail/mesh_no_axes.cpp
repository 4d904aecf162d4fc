// expect-error: mesh_needs_1_to_4_axes<0>
// A mesh with no axes.
#include <gshard/gshard.hpp>

using Bad = gshard::Mesh<>;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
