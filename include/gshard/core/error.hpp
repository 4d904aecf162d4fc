#pragma once
// gshard::Error: the one exception type the library throws for bad input.
#include <stdexcept>
#include <string>
#include <string_view>

namespace gshard {

/// Raised for every run-time mistake (sizes that disagree, a mesh that does not fit its
/// communicator, a malformed file). what() reads "gshard::<op>: <detail>".
class Error : public std::runtime_error {
 public:
  Error(std::string_view op, std::string_view detail)
      : std::runtime_error(format(op, detail)), op_(op), detail_(detail) {}

  /// The operation that raised the error, e.g. "Mesh" or "reshard".
  [[nodiscard]] const std::string& op() const noexcept { return op_; }
  /// The message without the "gshard::<op>: " prefix.
  [[nodiscard]] const std::string& detail() const noexcept { return detail_; }

 private:
  static std::string format(std::string_view op, std::string_view detail) {
    std::string text = "gshard::";
    text.append(op).append(": ").append(detail);
    return text;
  }
  std::string op_;
  std::string detail_;
};

}  // namespace gshard
