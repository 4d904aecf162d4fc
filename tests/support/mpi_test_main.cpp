// The main() of every distributed doctest executable: gshard::Environment brings MPI and Kokkos
// up (and down), and the cases run on every rank (test_runner.hpp). A test that plays an
// application owning MPI and Kokkos itself has its own main (gshard_add_mpi_test OWN_MAIN).
#include <gshard/mesh/environment.hpp>

#include "test_runner.hpp"

int main(int argc, char** argv) {
  gshard::Environment env(argc, argv);
  return gshard::test::run_doctest(argc, argv);
}
