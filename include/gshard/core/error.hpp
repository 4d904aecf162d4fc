#pragma once
// gshard::Error: the one exception type the library throws for bad input.
#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "trace.hpp"

namespace gshard {

namespace detail {

/// `path` with "dir/../" and "./" steps removed, lexically (no file system access).
inline std::string lexically_normal(std::string_view path) {
  std::string out;
  std::size_t kept[64];  // where each kept segment starts in out
  int depth = 0;
  std::size_t i = 0;
  if (path.starts_with('/')) {
    out = "/";
    i = 1;
  }
  while (i <= path.size()) {
    const std::size_t end = std::min(path.find('/', i), path.size());
    const std::string_view seg = path.substr(i, end - i);
    if (seg == "..") {
      if (depth > 0) {
        out.resize(kept[--depth]);
      } else {
        out.append("../");
      }
    } else if (!seg.empty() && seg != ".") {
      if (depth < 64) kept[depth++] = out.size();
      out.append(seg);
      if (end < path.size()) out.push_back('/');
    }
    i = end + 1;
  }
  return out;
}

/// The library's header folder (".../gshard/") as the compiler spells this header's path.
inline const std::string& library_root() {
  static const std::string root = [] {
    std::string self = lexically_normal(__FILE__);
    self.resize(self.size() - std::string_view("core/error.hpp").size());
    return self;
  }();
  return root;
}

/// Whether a source file is one of the library's own headers: a file under the folder this header
/// was included from, compared exactly (a user's folder named gshard/nn/ is not the library).
inline bool library_file(std::string_view file) {
  const std::string& root = library_root();
  if (file.find("/.") == std::string_view::npos && !file.starts_with('.'))
    return file.starts_with(root);
  return lexically_normal(file).starts_with(root);
}

/// While it lives, every gshard::Error names `where` (a public entry point's caller, captured by
/// a defaulted std::source_location). The outermost one wins, and the library's own calls of its
/// public functions never count: the line is the user's.
class UserSite {
 public:
  /// From a std::source_location (a template, so this header needs no <source_location>: the
  /// fuzz targets build it with a clang whose library lacks it).
  /// `op` names the call in traces (trace/timeline.hpp): each named call, nested ones too, is an
  /// "op" event there.
  template <class Location>
  explicit UserSite(const Location& where, const char* op = nullptr) noexcept
      : UserSite(where.file_name(), static_cast<std::uint_least32_t>(where.line()), op) {}
  UserSite(const char* file, std::uint_least32_t line, const char* op = nullptr) noexcept
      : outer_(user_site_state().file == nullptr && line != 0 && !library_file(file)),
        op_(op, file, line) {
    if (outer_) user_site_state() = {file, line};
  }
  UserSite(const UserSite&) = delete;
  UserSite& operator=(const UserSite&) = delete;
  ~UserSite() {
    op_.end();  // while the user's line is still set
    if (outer_) user_site_state() = {};
  }

 private:
  bool outer_;
  TraceOp op_;
};

}  // namespace detail

/// Raised for every run-time mistake (sizes that disagree, a mesh that does not fit its
/// communicator, a malformed file). what() reads "gshard::<op>: <detail> (at <file>:<line>)",
/// the line being the user's call that raised it (detail::UserSite) when known.
class Error : public std::runtime_error {
 public:
  Error(std::string_view op, std::string_view what)
      : std::runtime_error(format(op, what)), op_(op), detail_(what) {}

  /// The operation that raised the error, e.g. "Mesh" or "reshard".
  [[nodiscard]] const std::string& op() const noexcept { return op_; }
  /// The message without the "gshard::<op>: " prefix.
  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

 private:
  static std::string format(std::string_view op, std::string_view what) {
    std::string text = "gshard::";
    text.append(op).append(": ").append(what);
    const detail::UserSiteState& site = detail::user_site_state();
    if (site.file != nullptr) {
      std::string_view file = site.file;
      const auto slash = file.find_last_of('/');
      if (slash != std::string_view::npos) file.remove_prefix(slash + 1);
      text.append(" (at ").append(file).append(":").append(std::to_string(site.line)).append(")");
    }
    return text;
  }
  std::string op_;
  std::string detail_;
};

}  // namespace gshard
