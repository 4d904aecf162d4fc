#pragma once
// Bad input must raise the same gshard::Error on every rank: no rank may hang in a collective
// while another has thrown, and every rank's log must say the same thing.
#include <doctest/doctest.h>
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

#include <gshard/core/error.hpp>

namespace gshard::test {

// Runs f on every rank of `comm`; checks that it threw gshard::Error everywhere, with one text on
// every rank that contains `expected`. Returns this rank's text ("" when it did not throw).
inline std::string same_error_everywhere(const std::function<void()>& f,
                                         const std::string& expected,
                                         MPI_Comm comm = MPI_COMM_WORLD) {
  std::string text;
  bool threw = false;
  try {
    f();
  } catch (const gshard::Error& e) {
    threw = true;
    text = e.what();
  }
  // FNV-1a of the text: equal on every rank iff min == max.
  std::uint64_t h = 1469598103934665603ULL;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ULL;
  std::uint64_t lo = h, hi = h;
  int all_threw = threw ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UINT64_T, MPI_MIN, comm);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UINT64_T, MPI_MAX, comm);
  MPI_Allreduce(MPI_IN_PLACE, &all_threw, 1, MPI_INT, MPI_MIN, comm);
  INFO("this rank's error: ", text);
  CHECK_MESSAGE(all_threw == 1, "some rank did not throw gshard::Error");
  CHECK_MESSAGE(lo == hi, "the error text differs between ranks");
  CHECK_MESSAGE(text.find(expected) != std::string::npos, "expected the text: ", expected);
  return text;
}

}  // namespace gshard::test
