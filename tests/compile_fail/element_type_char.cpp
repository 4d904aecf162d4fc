// expect-error: gshard::Sharded: element type must be float, double, int32_t or int64_t
// char is not an element type (float, double, int32_t, int64_t).
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<char, M, "G">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
