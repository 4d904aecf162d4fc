#pragma once
// An opt-in watchdog for collectives. With a timeout set (set_collective_timeout, or the
// environment variable GSHARD_COLLECTIVE_TIMEOUT in seconds), a collective that has not returned
// within it is reported on stderr by its rank (the collective, its mesh axes, the op and layouts
// it serves, the user's line), and the rank exits with status 70, which makes mpirun end the job.
// A dead host or a stalled link then ends a job instead of hanging it. Off by default: a
// collective then pays one relaxed atomic load. The check runs on a thread of its own that never
// calls MPI (MPI_THREAD_FUNNELED holds); its period is a tenth of the timeout, at most 250 ms.
#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "../core/error.hpp"
#include "../core/trace.hpp"

namespace gshard {
namespace detail {

struct WatchdogState {
  std::atomic<std::int64_t> timeout_ns{-1};  // -1: the environment not read yet; 0: off
  std::atomic<std::int64_t> deadline_ns{0};  // steady clock; 0: no watched collective running
  std::mutex mutex;                          // guards `report`
  std::string report;                        // what the running collective would print
  std::once_flag thread_started;
};

inline WatchdogState& watchdog_state() {
  static WatchdogState state;
  return state;
}

inline std::int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

/// GSHARD_COLLECTIVE_TIMEOUT in ns (0: unset, empty or 0); a value that is not a non-negative
/// number of seconds is an Error naming the variable.
inline std::int64_t timeout_from_environment() {
  const char* text = std::getenv("GSHARD_COLLECTIVE_TIMEOUT");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds >= 0) || seconds > 1e9)
    throw Error("collective watchdog", std::string("GSHARD_COLLECTIVE_TIMEOUT=\"") + text +
                                           "\" is not a number of seconds (0 or unset: off)");
  return static_cast<std::int64_t>(seconds * 1e9);
}

inline void watchdog_loop() {
  WatchdogState& s = watchdog_state();
  for (;;) {
    const std::int64_t timeout = s.timeout_ns.load(std::memory_order_relaxed);
    const std::int64_t period = std::clamp<std::int64_t>(timeout / 10, 1'000'000, 250'000'000);
    std::this_thread::sleep_for(std::chrono::nanoseconds(period));
    const std::int64_t deadline = s.deadline_ns.load(std::memory_order_acquire);
    if (deadline == 0 || steady_ns() < deadline) continue;
    std::string report;
    {
      const std::lock_guard<std::mutex> lock(s.mutex);
      if (s.deadline_ns.load(std::memory_order_acquire) != deadline) continue;  // it returned
      report = s.report;
    }
    std::fprintf(stderr, "%s\n", report.c_str());
    std::fflush(stderr);
    std::_Exit(70);  // not MPI_Abort: MPI is funneled through the main thread, which is stuck
  }
}

inline std::int64_t collective_timeout_ns() {
  WatchdogState& s = watchdog_state();
  std::int64_t t = s.timeout_ns.load(std::memory_order_relaxed);
  if (t >= 0) return t;
  t = timeout_from_environment();
  s.timeout_ns.store(t, std::memory_order_relaxed);
  trace_state().describe = t > 0;
  return t;
}

/// While it lives, the collective `name` over `axes` (run on `comm`) is watched when a timeout is
/// set: the watchdog reports it and ends the job if it is still running after the timeout.
class CollectiveWatch {
 public:
  CollectiveWatch(const char* name, const std::string& axes, MPI_Comm comm) {
    const std::int64_t timeout = collective_timeout_ns();
    if (timeout == 0) return;
    arm(name, axes, comm, timeout);
  }
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;
  ~CollectiveWatch() {
    if (!armed_) return;
    WatchdogState& s = watchdog_state();
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.deadline_ns.store(0, std::memory_order_release);
  }

 private:
  void arm(const char* name, const std::string& axes, MPI_Comm comm, std::int64_t timeout) {
    WatchdogState& s = watchdog_state();
    std::call_once(s.thread_started, [] { std::thread(watchdog_loop).detach(); });
    static const std::string where = [] {  // this rank, once
      int rank = 0, size = 1;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      char host[256] = {};
      gethostname(host, sizeof(host) - 1);
      return "rank " + std::to_string(rank) + " of " + std::to_string(size) + " (host " + host +
             ")";
    }();
    int group_rank = 0, group_size = 1;
    MPI_Comm_rank(comm, &group_rank);
    MPI_Comm_size(comm, &group_size);
    const TraceState& t = trace_state();
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", static_cast<double>(timeout) * 1e-9);
    std::string r = "gshard: collective watchdog: " + where + " waited more than " + seconds +
                    " s in " + name + " over mesh axes \"" + axes + "\" (" +
                    std::to_string(group_size) + " ranks, this one " + std::to_string(group_rank) +
                    ")";
    if (t.op != nullptr)
      r += "\n  op: " + std::string(t.op) + " at " + trace_site(t.op_file, t.op_line);
    if (t.context != nullptr && !t.context->empty()) r += "\n  layouts: " + *t.context;
    const UserSiteState& u = user_site_state();
    if (u.file != nullptr && u.line != 0)
      r += "\n  your line: " + std::string(u.file) + ":" + std::to_string(u.line);
    r += "\n  a rank of the group is dead, stalled or not calling this collective; ending the job "
         "(GSHARD_COLLECTIVE_TIMEOUT, gshard::set_collective_timeout)";
    const std::lock_guard<std::mutex> lock(s.mutex);
    s.report = std::move(r);
    s.deadline_ns.store(steady_ns() + timeout, std::memory_order_release);
    armed_ = true;
  }
  bool armed_ = false;
};

}  // namespace detail

/// Watch every collective with `seconds` as its time limit (0: off, the default unless
/// GSHARD_COLLECTIVE_TIMEOUT is set). Call it on every rank alike, e.g. before training.
inline void set_collective_timeout(double seconds) {
  if (!(seconds >= 0) || seconds > 1e9)
    throw Error(
        "set_collective_timeout",
        "the timeout must be a non-negative number of seconds, not " + std::to_string(seconds));
  const auto ns = static_cast<std::int64_t>(seconds * 1e9);
  detail::watchdog_state().timeout_ns.store(ns, std::memory_order_relaxed);
  detail::trace_state().describe = ns > 0;
}

/// The collectives' time limit in seconds (0: off).
inline double collective_timeout() {
  return static_cast<double>(detail::collective_timeout_ns()) * 1e-9;
}

}  // namespace gshard
