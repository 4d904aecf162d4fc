// expect-error: malformed_piece<gshard::literal<3>{"GS"}
// A label longer than one letter (a missing space).
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "GS M">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
