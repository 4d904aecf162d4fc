#pragma once
// gshard::Error: the one exception type the library throws for bad input.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include "trace.hpp"

namespace gshard {

namespace detail {

/// Whether a source file is one of the library's headers (".../gshard/<layer>/<name>.hpp").
inline bool library_file(std::string_view file) noexcept {
  constexpr std::string_view layers[] = {"autodiff", "comm", "core", "expr", "io",    "kernels",
                                         "mesh",     "nn",   "ops",  "spmd", "tensor"};
  for (const std::string_view layer : layers)
    for (std::size_t at = file.find("/gshard/"); at != std::string_view::npos;
         at = file.find("/gshard/", at + 1))
      if (file.substr(at + 8).starts_with(layer) && file.size() > at + 8 + layer.size() &&
          file[at + 8 + layer.size()] == '/')
        return true;
  return false;
}

/// While it lives, every gshard::Error names `where` (a public entry point's caller, captured by
/// a defaulted std::source_location). The outermost one wins, and the library's own calls of its
/// public functions never count: the line is the user's.
class UserSite {
 public:
  /// From a std::source_location (a template, so this header needs no <source_location>: the
  /// fuzz targets build it with a clang whose library lacks it).
  /// `op` names the call in traces (io/trace.hpp): each named call, nested ones too, is an "op"
  /// event there.
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
