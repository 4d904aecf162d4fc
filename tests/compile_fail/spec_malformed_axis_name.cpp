// expect-error: malformed_piece<gshard::literal<8>{"G:da-ta"}
// An axis name that is not an identifier.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G:da-ta">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
