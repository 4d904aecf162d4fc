// expect-error: scan_label_must_be_one_letter<gshard::literal<4>{"Seq"}, gshard::literal<6>{"B S:y"}>
// Labels are one letter; "Seq" names no label.
#include <gshard/gshard.hpp>
#include <gshard/ops/scan.hpp>

using M = gshard::Mesh<"x", "y">;
using X = gshard::Sharded<double, M, "B S:y">;

auto bad(const X& x) { return gshard::exclusive_cumsum<"Seq">(x); }

int main() { return 0; }
