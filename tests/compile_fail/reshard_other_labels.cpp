// expect-error: labels_differ_between_layouts<gshard::literal<6>{"G S M"}, gshard::literal<6>{"G T M"}>
// reshard to a layout whose labels differ ("G T M" from "G S M"): rename with .as<"...">() first.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using From = gshard::Sharded<float, M, "G S M">;
using To = gshard::Sharded<float, M, "G T M">;

To bad(const From& x) { return gshard::reshard<To>(x); }

int main() { return 0; }
