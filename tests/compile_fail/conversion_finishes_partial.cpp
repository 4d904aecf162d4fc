// expect-error: conversion_communicates_write_reshard<gshard::literal<7>{"I J +x"}, gshard::literal<4>{"I J"}>
// Finishing pending partial sums is an AllReduce: assigning a partial tensor to a finished
// layout does not do it silently.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using Partial = gshard::Sharded<float, M, "I J +x">;
using Full = gshard::Sharded<float, M, "I J">;

void bad(const Partial& p) {
  const Full f = p;
  (void)f;
}

int main() { return 0; }
