// Runs the doctest cases of a distributed test executable on every rank (tests/support/
// test_runner.hpp). Each rank runs the same test cases; every line a rank prints carries
// "[rank r/n]", and a failure on any rank fails the run on all ranks (so mpirun and CTest see it)
// with a closing line naming the failed ranks.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <mpi.h>

#include <iostream>
#include <sstream>
#include <streambuf>
#include <string>
#include <vector>

#include "test_runner.hpp"

namespace {

// Prefixes every line written through it; forwards to the stream's original buffer.
class RankPrefixBuffer : public std::streambuf {
 public:
  RankPrefixBuffer(std::streambuf* target, std::string prefix)
      : target_(target), prefix_(std::move(prefix)) {}

 protected:
  int overflow(int ch) override {
    if (ch == traits_type::eof()) return traits_type::not_eof(ch);
    if (at_line_start_) {
      target_->sputn(prefix_.data(), static_cast<std::streamsize>(prefix_.size()));
      at_line_start_ = false;
    }
    if (ch == '\n') at_line_start_ = true;
    return target_->sputc(static_cast<char>(ch));
  }
  int sync() override { return target_->pubsync(); }

 private:
  std::streambuf* target_;
  std::string prefix_;
  bool at_line_start_ = true;
};

}  // namespace

int gshard::test::run_doctest(int argc, char** argv) {
  int rank = 0;
  int size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  const std::string prefix = "[rank " + std::to_string(rank) + "/" + std::to_string(size) + "] ";
  RankPrefixBuffer prefixed(std::cout.rdbuf(), prefix);
  std::ostream out(&prefixed);

  int failed = 0;
  {
    doctest::Context context;
    context.setOption("no-colors", true);  // logs go to files and CTest, not terminals
    context.applyCommandLine(argc, argv);
    context.setCout(&out);
    // Rank 0 reports in full; the others only their failures, so the log stays readable.
    if (rank != 0) context.setOption("minimal", true);
    failed = context.run() != 0 ? 1 : 0;
    if (context.shouldExit()) return failed;
  }
  out.flush();

  std::vector<int> failed_by_rank(static_cast<std::size_t>(size), 0);
  MPI_Gather(&failed, 1, MPI_INT, failed_by_rank.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0) {
    if (any_failed != 0) {
      std::ostringstream ranks;
      for (int r = 0; r < size; ++r)
        if (failed_by_rank[static_cast<std::size_t>(r)] != 0) ranks << ' ' << r;
      std::cout << "gshard-test: FAILED on rank(s)" << ranks.str() << " of " << size << std::endl;
    } else {
      std::cout << "gshard-test: passed on all " << size << " rank(s)" << std::endl;
    }
  }
  return any_failed;
}
