#pragma once
// Meshes and sharded tensors: Environment, Mesh, Sharded (creation, global I/O, uneven shards,
// adopting an application's Views), reshard and explain(plan), halo fields for stencils,
// communication counters. Includes layouts.hpp.
#include "comm/counters.hpp"
#include "layouts.hpp"
#include "mesh/environment.hpp"
#include "mesh/mesh.hpp"
#include "spmd/halo_field.hpp"
#include "spmd/reshard.hpp"
#include "tensor/adopt.hpp"
#include "tensor/creation.hpp"
#include "tensor/sharded.hpp"
