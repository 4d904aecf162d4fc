#pragma once
// The trace recorder behind gshard::Trace (trace/timeline.hpp): while it is on, each user-level op,
// local kernel and collective appends an event with its start, duration and the user's source
// line. While it is off, each of those sites costs one load of a flag.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gshard::detail {

/// The user's source line for errors and trace events raised now (set by detail::UserSite).
struct UserSiteState {
  const char* file = nullptr;
  std::uint_least32_t line = 0;
};

inline UserSiteState& user_site_state() noexcept {
  thread_local UserSiteState state;
  return state;
}

struct TraceEvent {
  std::string name;            // "einsum", "contract", "AllToAll"
  const char* category = "";   // "op", "kernel" or "collective"
  std::string detail;          // layouts, labels, GEMM shape
  std::string axes;            // a collective's mesh axes
  std::int64_t bytes = -1;     // the bytes a collective sends from this rank
  const char* file = nullptr;  // the user's source line
  std::uint_least32_t line = 0;
  std::string op;  // the innermost public call around it, "einsum at moe.hpp:301"
  double start_us = 0;
  double duration_us = 0;
};

struct TraceState {
  bool on = false;
  std::chrono::steady_clock::time_point epoch{};
  std::vector<TraceEvent> events;
  const std::string* context = nullptr;  // what the running collectives serve (a reshard's layouts)
  const char* op = nullptr;              // the innermost public call running (UserSite)
  const char* op_file = nullptr;
  std::uint_least32_t op_line = 0;
  bool describe =
      false;  // keep `context` and `op` current without tracing (the watchdog's reports)
};

inline std::string trace_site(const char* file, std::uint_least32_t line) {
  if (file == nullptr || line == 0) return "";
  std::string f = file;
  const auto slash = f.find_last_of('/');
  if (slash != std::string::npos) f.erase(0, slash + 1);
  return f + ":" + std::to_string(line);
}

inline TraceState& trace_state() noexcept {
  static TraceState state;
  return state;
}

/// Whether events are recorded now. GSHARD_NO_TRACE removes every trace site at compile time
/// (bench/trace.cpp measures what they cost when off).
inline bool tracing() noexcept {
#if defined(GSHARD_NO_TRACE)
  return false;
#else
  return trace_state().on;
#endif
}

/// Whether the running op and its layouts are kept for reports: when tracing or watching.
inline bool describing() noexcept { return tracing() || trace_state().describe; }

inline double trace_clock_us() noexcept {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() -
                                                   trace_state().epoch)
      .count();
}

/// One event from construction to destruction, recorded only if tracing was on at the start.
class TraceSpan {
 public:
  TraceSpan(const char* category, const char* name) noexcept
      : on_(tracing()), category_(category), name_(name) {
    if (on_) start_ = trace_clock_us();
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  ~TraceSpan() {
    if (!on_ || !tracing()) return;
    TraceEvent e;
    e.name = name_;
    e.category = category_;
    e.detail = std::move(detail_);
    if (e.detail.empty() && trace_state().context != nullptr) e.detail = *trace_state().context;
    e.axes = std::move(axes_);
    e.bytes = bytes_;
    e.file = user_site_state().file;
    e.line = user_site_state().line;
    const TraceState& t = trace_state();
    if (t.op != nullptr) e.op = std::string(t.op) + " at " + trace_site(t.op_file, t.op_line);
    e.start_us = start_;
    e.duration_us = trace_clock_us() - start_;
    trace_state().events.push_back(std::move(e));
  }

  /// Whether this span records: build its details only then.
  [[nodiscard]] bool on() const noexcept { return on_; }
  void set_detail(std::string d) { detail_ = std::move(d); }
  void set_collective(std::string axes, std::int64_t bytes) {
    axes_ = std::move(axes);
    bytes_ = bytes;
  }

 private:
  bool on_;
  const char* category_;
  const char* name_;
  double start_ = 0;
  std::string detail_, axes_;
  std::int64_t bytes_ = -1;
};

/// While it lives, collectives without details of their own are described by `text` (built only
/// when tracing: pass a callable).
class TraceContext {
 public:
  template <class F>
  explicit TraceContext(F&& describe) {
    if (!describing()) return;
    text_ = std::forward<F>(describe)();
    previous_ = trace_state().context;
    trace_state().context = &text_;
    set_ = true;
  }
  TraceContext(const TraceContext&) = delete;
  TraceContext& operator=(const TraceContext&) = delete;
  ~TraceContext() {
    if (set_) trace_state().context = previous_;
  }

 private:
  bool set_ = false;
  std::string text_;
  const std::string* previous_ = nullptr;
};

/// A named call (a public op, or the backward of one) from construction to end(): an "op" event
/// at the user's line, and the "op" of every event inside it.
class TraceOp {
 public:
  TraceOp(const char* name, const char* file, std::uint_least32_t line, const char* prefix = "") {
    if (name == nullptr || !describing()) return;
    TraceState& t = trace_state();
    on_ = true;
    name_ = std::string(prefix) + name;
    file_ = file;
    line_ = line;
    outer_ = t.op;
    outer_file_ = t.op_file;
    outer_line_ = t.op_line;
    t.op = name_.c_str();
    t.op_file = file;
    t.op_line = line;
    start_ = trace_clock_us();
  }
  TraceOp(const TraceOp&) = delete;
  TraceOp& operator=(const TraceOp&) = delete;
  ~TraceOp() { end(); }

  void end() {
    if (!on_) return;
    on_ = false;
    TraceState& t = trace_state();
    t.op = outer_;
    t.op_file = outer_file_;
    t.op_line = outer_line_;
    if (!t.on) return;
    TraceEvent e;
    e.category = "op";
    e.file = user_site_state().file;
    e.line = user_site_state().line;
    e.op = name_ + " at " + trace_site(file_, line_);
    e.name = std::move(name_);
    e.start_us = start_;
    e.duration_us = trace_clock_us() - start_;
    t.events.push_back(std::move(e));
  }

 private:
  bool on_ = false;
  std::string name_;
  const char* file_ = nullptr;
  std::uint_least32_t line_ = 0;
  const char* outer_ = nullptr;
  const char* outer_file_ = nullptr;
  std::uint_least32_t outer_line_ = 0;
  double start_ = 0;
};

}  // namespace gshard::detail
