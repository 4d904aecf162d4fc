// expect-error: labels_differ_between_layouts<gshard::literal<6>{"G S M"}, gshard::literal<4>{"A B"}>
// Assignment reshards, so it too needs the same labels: "A B" from "G S M".
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data", "expert">;
using From = gshard::Sharded<float, M, "G S M">;
using To = gshard::Sharded<float, M, "A B">;

void bad(const From& x) {
  To y = x;
  (void)y;
}

int main() { return 0; }
