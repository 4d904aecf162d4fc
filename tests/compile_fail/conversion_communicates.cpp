// expect-error: conversion_communicates_write_reshard<gshard::literal<6>{"I:x J"}, gshard::literal<6>{"I J:x"}>
// Passing a tensor to a function that takes another layout would hide a collective (an AllToAll
// that every rank must make); conversions never communicate, the reshard is written out.
#include <gshard/gshard.hpp>

using M = gshard::Mesh<"x">;
using Rows = gshard::Sharded<float, M, "I:x J">;
using Cols = gshard::Sharded<float, M, "I J:x">;

float first(const Cols& c);
float bad(const Rows& r) { return first(r); }

int main() { return 0; }
