// expect-error: mesh_axis_name_is_not_an_identifier<gshard::literal<4>{"a b"}>
// A mesh axis name with a space in it.
#include <gshard/gshard.hpp>

using Bad = gshard::Mesh<"a b">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
