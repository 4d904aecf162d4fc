// expect-error: partial_axis_also_splits_a_dimension<gshard::literal<5>{"data"}
// A partial axis also splits a dimension.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using Bad = gshard::Sharded<float, M, "G:data S +data">;

int main() { return sizeof(Bad) == 0 ? 1 : 0; }
