#pragma once
// Communication counters: calls and bytes sent per rank, per mesh axis (or set of axes) and per
// collective kind. Bytes follow the bandwidth-optimal textbook volume of each collective for a
// payload of S bytes per rank over k ranks (docs/design.md):
//   AllGather (k-1)*S   AllToAll (k-1)/k*S   AllReduce 2(k-1)/k*S   ReduceScatter (k-1)/k*S
//   CollectivePermute S (0 when a rank keeps its own block)   AllToAllv: the bytes it sends to
//   others   ExScan S (a prefix over the group; every rank but the last passes S on)
#include <cstdint>
#include <map>
#include <string>
#include <utility>

namespace gshard {

enum class Collective {
  all_gather,
  all_to_all,
  all_to_all_v,
  all_reduce,
  reduce_scatter,
  permute,
  exscan
};

inline const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_gather:
      return "AllGather";
    case Collective::all_to_all:
      return "AllToAll";
    case Collective::all_to_all_v:
      return "AllToAllv";
    case Collective::all_reduce:
      return "AllReduce";
    case Collective::reduce_scatter:
      return "ReduceScatter";
    case Collective::permute:
      return "CollectivePermute";
    case Collective::exscan:
      return "ExScan";
  }
  return "?";
}

struct CommCount {
  std::int64_t calls = 0;
  std::int64_t bytes = 0;  // sent by this rank
};

namespace detail {
struct CommCountersAccess;
}  // namespace detail

/// Per-process counters. Axes are named as in the mesh; a collective over several axes is
/// counted under their names joined by '*', e.g. "data*expert".
class CommCounters {
 public:
  [[nodiscard]] CommCount get(const std::string& axes, Collective kind) const {
    auto it = counts_.find({axes, kind});
    return it == counts_.end() ? CommCount{} : it->second;
  }
  /// Sum over every axis and kind.
  [[nodiscard]] CommCount total() const {
    CommCount t;
    for (const auto& [key, c] : counts_) {
      t.calls += c.calls;
      t.bytes += c.bytes;
    }
    return t;
  }
  [[nodiscard]] const std::map<std::pair<std::string, Collective>, CommCount>& all() const {
    return counts_;
  }
  void reset() { counts_.clear(); }

 private:
  friend struct detail::CommCountersAccess;
  std::map<std::pair<std::string, Collective>, CommCount> counts_;
};

namespace detail {

/// The library's one way to count a collective (users read the counters, never write them).
struct CommCountersAccess {
  static void add(CommCounters& c, const std::string& axes, Collective kind, std::int64_t bytes) {
    CommCount& n = c.counts_[{axes, kind}];
    n.calls += 1;
    n.bytes += bytes;
  }
};

}  // namespace detail

/// The process-wide counters every collective reports to.
inline CommCounters& comm_counters() {
  static CommCounters counters;
  return counters;
}

}  // namespace gshard
