#pragma once
// The doctest run of a distributed test executable, for a main() that has MPI and Kokkos up.

namespace gshard::test {

/// Runs the doctest cases selected by the command line on every rank of MPI_COMM_WORLD (rank 0
/// reports in full, the others their failures); returns nonzero on every rank when any failed.
/// Collective over MPI_COMM_WORLD.
int run_doctest(int argc, char** argv);

}  // namespace gshard::test
