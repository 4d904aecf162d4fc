// The collective watchdog (comm/watchdog.hpp): off by default, set by the API or the environment,
// bad values rejected, no report while collectives return in time, and the report names the
// collective, its axes, the op and the user's line. The cases "watchdog:*" are skipped unless
// asked for by name: tests/CMakeLists.txt runs them with one rank missing a collective and checks
// that the job ends within seconds with the report (the harness's expect_failure.cmake).
#include "mpi_test.hpp"
// clang-format off
#include <gshard/gshard.hpp>
// clang-format on

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "grad_checks.hpp"

namespace {

namespace gs = gshard;
using Line = gs::Mesh<"x">;
using Rows = gs::Sharded<double, Line, "I:x J">;
using Scalar = gs::Sharded<double, Line, "">;

Line line() { return Line(MPI_COMM_WORLD, {gshard::test::world_size()}); }

// A sum over the split rows: an AllReduce over x (at more than one rank) in the reshard.
constexpr int total_line = __LINE__ + 1;
Scalar total(const Rows& a) { return gs::reshard<Scalar>(gs::einsum<"IJ->">(a)); }

TEST_CASE("the watchdog is off unless set, and its settings are checked") {
  CHECK(std::getenv("GSHARD_COLLECTIVE_TIMEOUT") == nullptr);  // the suite runs without it
  CHECK(gs::collective_timeout() == 0.0);
  gs::set_collective_timeout(2.5);
  CHECK(gs::collective_timeout() == 2.5);
  gs::set_collective_timeout(0);
  CHECK(gs::collective_timeout() == 0.0);
  CHECK_THROWS_AS(gs::set_collective_timeout(-1), gs::Error);

  ::setenv("GSHARD_COLLECTIVE_TIMEOUT", "1.5", 1);
  CHECK(gs::detail::timeout_from_environment() == 1'500'000'000);
  for (const char* bad : {"abc", "-2", "3s"}) {
    ::setenv("GSHARD_COLLECTIVE_TIMEOUT", bad, 1);
    INFO(bad);
    CHECK_THROWS_WITH_AS(gs::detail::timeout_from_environment(),
                         doctest::Contains("GSHARD_COLLECTIVE_TIMEOUT"), gs::Error);
  }
  ::setenv("GSHARD_COLLECTIVE_TIMEOUT", "0", 1);
  CHECK(gs::detail::timeout_from_environment() == 0);
  ::unsetenv("GSHARD_COLLECTIVE_TIMEOUT");
}

TEST_CASE(
    "watched collectives that return in time: no report, the same values, and the report "
    "it would give names the collective, the op and the user's line") {
  const Line mesh = line();
  const auto a = gshard::test::make<Rows>(mesh, {11, 3}, 5);  // uneven rows
  const double want = total(a).to_global()[0];
  gs::set_collective_timeout(30);
  double got = 0;
  std::string report;
  for (int i = 0; i < 200; ++i) {
    const Scalar t = total(a);
    if (i == 0) {  // what the watchdog would have said about the reshard's AllReduce
      const std::lock_guard<std::mutex> lock(gs::detail::watchdog_state().mutex);
      report = gs::detail::watchdog_state().report;
    }
    got = t.to_global()[0];
  }
  CHECK(got == want);
  CHECK(gs::detail::watchdog_state().deadline_ns.load() == 0);  // disarmed after each
  if (gshard::test::world_size() > 1) {
    INFO(report);
    CHECK(report.find("collective watchdog: rank " + std::to_string(gshard::test::world_rank()) +
                      " of " + std::to_string(gshard::test::world_size())) != std::string::npos);
    CHECK(report.find("waited more than 30 s") != std::string::npos);
    CHECK(report.find("AllReduce over mesh axes \"x\"") != std::string::npos);
    CHECK(report.find("op: reshard at watchdog_test.cpp:" + std::to_string(total_line)) !=
          std::string::npos);
    CHECK(report.find("layouts: ") != std::string::npos);
    CHECK(report.find("your line: ") != std::string::npos);
  }
  gs::set_collective_timeout(0);
}

// The last rank misses the collective for a minute; the others' watchdog must end the job.
void last_rank_late(bool by_api) {
  const Line mesh = line();
  const auto a = gshard::test::make<Rows>(mesh, {8, 2}, 3);
  if (by_api) gs::set_collective_timeout(1);
  if (gshard::test::world_rank() == gshard::test::world_size() - 1)
    std::this_thread::sleep_for(std::chrono::seconds(60));
  CHECK(total(a).to_global()[0] != 0);
}

TEST_CASE("watchdog:fires-when-a-rank-is-late" * doctest::skip()) { last_rank_late(true); }
TEST_CASE("watchdog:fires-by-environment" * doctest::skip()) { last_rank_late(false); }

// Collectives for up to 10 minutes (tests/multihost/watchdog_stall.sh cuts a host's link while
// it runs); rank 0 says when the loop is going.
TEST_CASE("watchdog:loop" * doctest::skip()) {
  const Line mesh = line();
  const auto a = gshard::test::make<Rows>(mesh, {64, 8}, 3);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; std::chrono::steady_clock::now() - start < std::chrono::minutes(10); ++i) {
    // The reshard's AllReduce is the only collective (the scalar is read from this rank's copy).
    const auto t = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), total(a).local_view());
    CHECK(t(0) != 0);
    if (i == 20 && gshard::test::world_rank() == 0) {
      std::printf("watchdog:loop is running\n");
      std::fflush(stdout);
    }
  }
}

}  // namespace
