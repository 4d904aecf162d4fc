#pragma once
// The benches' command lines through CLI11 (as the main job's): parse, and on --help or a bad
// option print CLI11's text where asked (rank 0) and say which exit code to end with.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <optional>
#include <sstream>

namespace bench {

/// std::nullopt to go on, or the exit code when the run should end now (--help: 0).
inline std::optional<int> parse_cli(CLI::App& app, int argc, char** argv, bool print) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    if (print) std::fprintf(code ? stderr : stdout, "%s%s", out.str().c_str(), err.str().c_str());
    return code;
  }
  return std::nullopt;
}

}  // namespace bench
