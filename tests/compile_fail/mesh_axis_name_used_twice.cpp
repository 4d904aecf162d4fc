// expect-error: mesh_axis_name_used_twice<gshard::literal<2>{"x"}>
// Two mesh axes share the name "x".
#include <gshard/gshard.hpp>

using Bad = gshard::Mesh<"x", "x">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
