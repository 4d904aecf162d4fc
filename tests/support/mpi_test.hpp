#pragma once
// Helpers for distributed doctest cases (linked with mpi_test_main.cpp).
#include <doctest/doctest.h>
#include <mpi.h>

// The core every test uses (meshes, tensors, einsum, elementwise expressions); each test file
// includes the op and layer headers it tests, so a device build compiles only those.
#include <gshard/mesh/environment.hpp>
#include <gshard/ops/einsum.hpp>
#include <gshard/ops/elementwise.hpp>
#include <gshard/tensor/creation.hpp>
#include <gshard/tensor/sharded.hpp>

namespace gshard::test {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

}  // namespace gshard::test
