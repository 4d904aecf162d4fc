// expect-error: label_used_twice<gshard::literal<2>{"G"}
// Two dimensions share the label G.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G S G">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
