// expect-error: label_repeated<gshard::literal<4>{"sum"}, gshard::literal<2>{"S"}, gshard::literal<4>{"SMS"}>
// A label given twice.
#include <gshard/gshard.hpp>
#include <gshard/ops/reduce.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<float, M, "B:x S:y M">;

auto bad(const X& x) { return gshard::sum<"SMS">(x); }

int main() { return 0; }
