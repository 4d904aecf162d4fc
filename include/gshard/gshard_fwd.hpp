#pragma once
// Declarations of gshard's main types, for headers that name them in signatures without using
// them (a model's header, a solver's interface): no MPI, no Kokkos, no definitions. Include a
// layer's header (tensor.hpp, einsum.hpp, ..., gshard.hpp) where the types are used.
#include "core/fixed_string.hpp"

namespace gshard {

template <fixed_string... Names>
class Mesh;
template <class T, class MeshT, fixed_string Spec>
class Sharded;
class Environment;
struct EnvironmentOptions;
class Error;
struct Seed;
class NoGrad;
class Trace;
struct StepPlan;

namespace io {
class SafetensorsWriter;
class SafetensorsReader;
}  // namespace io

}  // namespace gshard
