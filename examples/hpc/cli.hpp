#pragma once
// What the HPC examples' command lines share: a 2-D process grid from "PxQ" or as square as the
// rank count allows, and a main that parses with CLI11 and reports errors once, from rank 0.
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <array>
#include <cstdio>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string>

namespace hpc {

/// P x Q = ranks from `text` ("PxQ"), or as square as the rank count allows (P <= Q).
inline std::array<int, 2> grid_shape(const std::string& text, int ranks, const char* option) {
  if (!text.empty()) {
    int p = 0, q = 0;
    if (std::sscanf(text.c_str(), "%dx%d", &p, &q) != 2 || p * q != ranks)
      throw std::runtime_error(std::string(option) + " " + text +
                               ": want PxQ with P*Q = " + std::to_string(ranks));
    return {p, q};
  }
  int p = 1;
  for (int d = 1; d * d <= ranks; ++d)
    if (ranks % d == 0) p = d;
  return {p, ranks / p};
}

/// Parses the command line (help and errors printed by rank 0 only), then returns run()'s exit
/// status, or 1 with the message of what it threw.
template <class Run>
int parse_and_run(CLI::App& app, int argc, char** argv, const char* name, Run run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    return me == 0 ? app.exit(e) : (e.get_exit_code() != 0 ? 1 : 0);
  }
  try {
    return run();
  } catch (const std::exception& e) {
    std::cerr << name << ": " << e.what() << "\n";
    return 1;
  }
}

}  // namespace hpc
