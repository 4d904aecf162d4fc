#pragma once
// A user's header in a folder named gshard/nn/ (environment_test.cpp): gshard must take it for
// the user's code, not its own, and name this line in errors.
#include <gshard/mesh/mesh.hpp>

namespace user_model {

inline constexpr int bad_mesh_line = __LINE__ + 2;
/// Builds a mesh one rank larger than the communicator: an Error at this line.
inline void make_bad_mesh(int world) { const gshard::Mesh<"x"> bad(MPI_COMM_WORLD, {world + 1}); }

}  // namespace user_model
