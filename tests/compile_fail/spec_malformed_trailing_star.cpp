// expect-error: malformed_piece<gshard::literal<8>{"G:data*"}
// A '*' with no axis after it.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G:data* S">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
