#pragma once
// Traces and step plans. gshard::Trace records, on every rank, a timeline of the user's ops, the
// local kernels they run and the collectives between shards (op, layouts, bytes, source line);
// write_chrome() merges the ranks into one Chrome trace JSON file (Perfetto, chrome://tracing),
// one process per rank. plan() sums the recorded steps into a StepPlan: the collectives of a
// step (kind, axes, calls, bytes this rank sends) and the ops that took the time, as text or
// JSON. explain_step(mesh, step) does both for a callable that runs one training step.
#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <source_location>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "../comm/agree.hpp"
#include "../core/error.hpp"
#include "../core/trace.hpp"

namespace gshard {

/// What the recorded steps did on one rank, per step.
struct StepPlan {
  struct CollectiveRow {
    std::string kind;  // "AllToAll"
    std::string axes;  // mesh axes, joined by '*'
    double calls = 0;  // per step
    double bytes = 0;  // sent by this rank, per step
    double ms = 0;     // time inside the collective, per step
  };
  struct OpRow {
    std::string op;    // the call and its line, "einsum at moe.hpp:301", "grad of top_k at ..."
    std::string site;  // the user's line it ran for, "train.hpp:116"
    double calls = 0;  // per step
    double ms = 0;     // self time (without the ops it called), per step
    double share = 0;  // of the traced ops' time
  };
  int rank = 0;
  int steps = 0;
  double op_ms = 0;                        // time inside the user's ops, per step
  double collective_ms = 0;                // of which in collectives
  std::vector<CollectiveRow> collectives;  // by kind, then axes
  std::vector<OpRow> ops;                  // longest first

  [[nodiscard]] std::string text(std::size_t top = 10) const {
    std::string s;
    char line[320];
    std::snprintf(line, sizeof line,
                  "step plan on rank %d (mean of %d step(s)): %.3f ms in ops, %.3f ms in "
                  "collectives\n  collectives per step:\n    %-18s %-20s %8s %12s %10s\n",
                  rank, steps, op_ms, collective_ms, "kind", "axes", "calls", "MB sent", "ms");
    s += line;
    for (const auto& c : collectives) {
      std::snprintf(line, sizeof line, "    %-18s %-20s %8.2f %12.6f %10.3f\n", c.kind.c_str(),
                    c.axes.c_str(), c.calls, c.bytes / 1e6, c.ms);
      s += line;
    }
    std::snprintf(line, sizeof line,
                  "  top ops by self time per step:\n    %-48s %-20s %8s %10s %6s\n", "op",
                  "for the user's line", "calls", "ms", "share");
    s += line;
    for (std::size_t i = 0; i < ops.size() && i < top; ++i) {
      const OpRow& o = ops[i];
      std::string name = o.op.size() > 48 ? "..." + o.op.substr(o.op.size() - 45) : o.op;
      std::snprintf(line, sizeof line, "    %-48s %-20s %8.2f %10.3f %5.1f%%\n", name.c_str(),
                    o.site.c_str(), o.calls, o.ms, 100 * o.share);
      s += line;
    }
    return s;
  }

  [[nodiscard]] std::string json() const {
    nlohmann::json j;
    j["rank"] = rank;
    j["steps"] = steps;
    j["op_ms_per_step"] = op_ms;
    j["collective_ms_per_step"] = collective_ms;
    j["collectives"] = nlohmann::json::array();
    for (const auto& c : collectives)
      j["collectives"].push_back({{"kind", c.kind},
                                  {"axes", c.axes},
                                  {"calls_per_step", c.calls},
                                  {"bytes_per_step", c.bytes},
                                  {"ms_per_step", c.ms}});
    j["ops"] = nlohmann::json::array();
    for (const auto& o : ops)
      j["ops"].push_back({{"op", o.op},
                          {"site", o.site},
                          {"calls_per_step", o.calls},
                          {"ms_per_step", o.ms},
                          {"share", o.share}});
    return j.dump(2);
  }
};

namespace detail {

inline std::string site_text(const TraceEvent& e) { return trace_site(e.file, e.line); }

// One Trace at a time records: the recorder is process-wide.
inline bool& trace_alive() noexcept {
  static bool alive = false;
  return alive;
}

}  // namespace detail

/// Records a timeline on every rank of `comm` between begin_step() and end_step() (or, for a
/// whole program, start() and stop()). Construction is collective (a barrier aligns the ranks'
/// clocks); one Trace may live at a time.
class Trace {
 public:
  explicit Trace(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    detail::agree(comm_, "Trace", detail::trace_alive() ? "another gshard::Trace is alive" : "");
    detail::trace_alive() = true;
    auto& s = detail::trace_state();
    s.events.clear();
    MPI_Barrier(comm_);
    s.epoch = std::chrono::steady_clock::now();
  }
  template <class MeshT>
  requires requires(const MeshT& m) { m.comm(); }
  explicit Trace(const MeshT& mesh) : Trace(mesh.comm()) {}
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;
  ~Trace() {
    auto& s = detail::trace_state();
    s.on = false;
    s.events.clear();
    s.events.shrink_to_fit();
    detail::trace_alive() = false;
  }

  /// Records from here (the events of one step follow).
  void begin_step() { detail::trace_state().on = true; }
  /// Stops recording and counts one step.
  void end_step() {
    detail::trace_state().on = false;
    ++steps_;
  }
  void start() { detail::trace_state().on = true; }
  void stop() { detail::trace_state().on = false; }

  [[nodiscard]] const std::vector<detail::TraceEvent>& events() const {
    return detail::trace_state().events;
  }
  [[nodiscard]] int steps() const noexcept { return steps_; }

  /// This rank's recorded steps, summed per step.
  [[nodiscard]] StepPlan plan() const {
    StepPlan p;
    p.rank = rank_;
    p.steps = steps_;
    const double per = 1.0 / std::max(steps_, 1);
    std::map<std::pair<std::string, std::string>, StepPlan::CollectiveRow> coll;
    std::map<std::pair<std::string, std::string>, StepPlan::OpRow> ops;
    // Ops nest (an op calls others): each is charged its self time, so the shares add up.
    std::vector<const detail::TraceEvent*> nested;
    for (const auto& e : events())
      if (std::string_view(e.category) == "op") nested.push_back(&e);
    // std::sort with the event's place as the last key: stable_sort's temporary buffer is
    // deprecated in libstdc++ 12 and clang warns about it in every user's build.
    std::sort(nested.begin(), nested.end(), [](const auto* a, const auto* b) {
      if (a->start_us != b->start_us) return a->start_us < b->start_us;
      if (a->duration_us != b->duration_us) return a->duration_us > b->duration_us;
      return a < b;
    });
    std::vector<double> self(nested.size());
    std::vector<std::size_t> open;
    for (std::size_t i = 0; i < nested.size(); ++i) {
      const detail::TraceEvent& e = *nested[i];
      self[i] = e.duration_us;
      while (!open.empty() &&
             nested[open.back()]->start_us + nested[open.back()]->duration_us <= e.start_us)
        open.pop_back();
      if (!open.empty())
        self[open.back()] -= e.duration_us;
      else
        p.op_ms += per * e.duration_us / 1e3;
      open.push_back(i);
    }
    for (std::size_t i = 0; i < nested.size(); ++i) {
      const detail::TraceEvent& e = *nested[i];
      const std::string site = detail::site_text(e);
      auto& row = ops[{e.op, site}];
      row.op = e.op;
      row.site = site;
      row.calls += per;
      row.ms += per * std::max(self[i], 0.0) / 1e3;
    }
    for (const auto& e : events()) {
      if (std::string_view(e.category) != "collective") continue;
      auto& row = coll[{e.name, e.axes}];
      row.kind = e.name;
      row.axes = e.axes;
      row.calls += per;
      row.bytes += per * static_cast<double>(e.bytes);
      row.ms += per * e.duration_us / 1e3;
      p.collective_ms += per * e.duration_us / 1e3;
    }
    for (auto& [key, row] : coll) p.collectives.push_back(row);
    for (auto& [key, row] : ops) {
      row.share = p.op_ms > 0 ? row.ms / p.op_ms : 0;
      p.ops.push_back(row);
    }
    std::sort(p.ops.begin(), p.ops.end(), [](const auto& a, const auto& b) {
      if (a.ms != b.ms) return a.ms > b.ms;
      return a.op != b.op ? a.op < b.op : a.site < b.site;  // the map's order: (op, site) is unique
    });
    return p;
  }

  /// Collective: every rank's events in one Chrome trace JSON file at `path` (written by rank 0),
  /// one process per rank; times in microseconds since the Trace began.
  void write_chrome(const std::string& path,
                    std::source_location where = std::source_location::current()) const {
    const detail::UserSite site(where, "write_chrome");
    nlohmann::json mine = nlohmann::json::array();
    mine.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank_},
                    {"args", {{"name", "rank " + std::to_string(rank_)}}}});
    for (const auto& e : events()) {
      nlohmann::json args = {{"site", detail::site_text(e)}};
      if (!e.op.empty()) args["op"] = e.op;
      if (!e.detail.empty()) args["layouts"] = e.detail;
      if (e.bytes >= 0) {
        args["axes"] = e.axes;
        args["bytes"] = e.bytes;
      }
      mine.push_back({{"name", e.name},
                      {"cat", e.category},
                      {"ph", "X"},
                      {"ts", e.start_us},
                      {"dur", e.duration_us},
                      {"pid", rank_},
                      {"tid", 0},
                      {"args", std::move(args)}});
    }
    std::string text = mine.dump();
    text = text.substr(1, text.size() - 2);  // the elements, to be joined with the others'
    int ranks = 1;
    MPI_Comm_size(comm_, &ranks);
    const long long size = static_cast<long long>(text.size());
    std::vector<long long> sizes(static_cast<std::size_t>(ranks));
    MPI_Gather(&size, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, 0, comm_);
    std::string error;
    if (rank_ == 0) {
      for (int r = 0; r < ranks; ++r)
        if (sizes[static_cast<std::size_t>(r)] > (1LL << 30))
          error = "rank " + std::to_string(r) + "'s trace exceeds 1 GiB; trace fewer steps";
    }
    detail::agree(comm_, "Trace::write_chrome", error);
    if (rank_ != 0) {
      MPI_Send(text.data(), static_cast<int>(size), MPI_CHAR, 0, 0, comm_);
    } else {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"gshard\",\"ranks\":"
          << ranks << ",\"steps\":" << steps_ << "},\"traceEvents\":[" << text;
      std::string other;
      for (int r = 1; r < ranks; ++r) {
        other.resize(static_cast<std::size_t>(sizes[static_cast<std::size_t>(r)]));
        MPI_Recv(other.data(), static_cast<int>(other.size()), MPI_CHAR, r, 0, comm_,
                 MPI_STATUS_IGNORE);
        out << "," << other;
      }
      out << "]}\n";
      out.close();
      if (!out) error = "cannot write " + path;
    }
    detail::agree(comm_, "Trace::write_chrome", error);
  }

 private:
  MPI_Comm comm_;
  int rank_ = 0;
  int steps_ = 0;
};

/// Runs `step(i)` for i = 0..steps-1 under a Trace and returns its plan (collective over the
/// mesh: every rank runs the steps).
template <class MeshT, class F>
StepPlan explain_step(const MeshT& mesh, F&& step, int steps = 1) {
  Trace t(mesh);
  for (int i = 0; i < steps; ++i) {
    t.begin_step();
    step(i);
    t.end_step();
  }
  return t.plan();
}

}  // namespace gshard
