// expect-error: store_needs_finished_partial_sums<gshard::literal<7>{"I J +x"}>
// Pending partial sums are not the value: storing them into the application's View is refused.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using Partial = gshard::Sharded<double, M, "I J +x">;

void bad(const Partial& p, const Kokkos::View<double**>& v) { gshard::store(p, v); }

int main() { return 0; }
