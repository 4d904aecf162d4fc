// expect-error: more_than_8_labels_in_einsum_term<gshard::literal<10>{"ABCDEFGHI"}
// An output of 9 labels: tensors have at most 8 dimensions.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"data">;
using A = gshard::Sharded<float, M, "A B C D E">;
using B = gshard::Sharded<float, M, "F G H I">;

auto bad(const A& a, const B& b) { return gshard::einsum<"ABCDE,FGHI->ABCDEFGHI">(a, b); }

int main() { return 0; }
