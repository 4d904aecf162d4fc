// expect-error: too_many_dimensions<gshard::literal<2>{"I"}
// Nine dimensions; a layout has at most 8.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "A B C D E F G H I">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
