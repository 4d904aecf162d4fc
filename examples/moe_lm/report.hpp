#pragma once
// The main job's output: the loss curve and the expert load per language as CSV, drawn to PNG by
// gnuplot (Debian's gnuplot-nox, run as a program on a generated script), and the progress
// lines. Call the writers on one rank only; they do no communication.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gshard/core/error.hpp>

extern char** environ;

namespace moe_lm {

/// One row of the loss curve; held_out_loss is NaN at steps without an evaluation.
struct LossRecord {
  std::int64_t step = 0;
  double train_loss = 0;
  double aux_loss = 0;
  double held_out_loss = std::nan("");
};

/// Loss records as text (one "step train aux held_out" line each, 17 digits: exact), for the
/// checkpoint's metadata, and back.
inline std::string records_text(const std::vector<LossRecord>& records) {
  std::string out;
  char line[128];
  for (const auto& r : records) {
    std::snprintf(line, sizeof line, "%lld %.17g %.17g %.17g\n", static_cast<long long>(r.step),
                  r.train_loss, r.aux_loss, r.held_out_loss);
    out += line;
  }
  return out;
}

inline std::vector<LossRecord> parse_records(const std::string& text) {
  std::vector<LossRecord> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    LossRecord r;
    char* end = nullptr;
    const char* p = line.c_str();
    r.step = std::strtoll(p, &end, 10);
    double* fields[] = {&r.train_loss, &r.aux_loss, &r.held_out_loss};
    bool ok = end != p;
    for (double* f : fields) {
      p = end;
      *f = std::strtod(p, &end);
      ok = ok && end != p;
    }
    if (!ok) throw gshard::Error("moe_lm::parse_records", "malformed loss record \"" + line + "\"");
    out.push_back(r);
  }
  return out;
}

/// Token counts routed to each expert, per language of the token's row.
class ExpertLoad {
 public:
  ExpertLoad(std::vector<std::string> languages, int experts)
      : languages_(std::move(languages)),
        experts_(experts),
        counts_(languages_.size() * static_cast<std::size_t>(std::max(experts, 0)), 0.0) {
    if (experts < 1 || languages_.empty())
      throw gshard::Error("moe_lm::ExpertLoad", "need at least one language and one expert, got " +
                                                    std::to_string(languages_.size()) + " and " +
                                                    std::to_string(experts));
  }
  void add(int language, int expert, double tokens = 1) {
    counts_.at(index(language, expert)) += tokens;
  }
  [[nodiscard]] double count(int language, int expert) const {
    return counts_.at(index(language, expert));
  }
  /// The share of the language's routed tokens that went to the expert (rows sum to 1; 0 when
  /// the language routed nothing).
  [[nodiscard]] double fraction(int language, int expert) const {
    double total = 0;
    for (int e = 0; e < experts_; ++e) total += count(language, e);
    return total > 0 ? count(language, expert) / total : 0.0;
  }
  [[nodiscard]] const std::vector<std::string>& languages() const { return languages_; }
  [[nodiscard]] int experts() const { return experts_; }

 private:
  [[nodiscard]] std::size_t index(int language, int expert) const {
    if (language < 0 || static_cast<std::size_t>(language) >= languages_.size() || expert < 0 ||
        expert >= experts_)
      throw gshard::Error("moe_lm::ExpertLoad", "language " + std::to_string(language) +
                                                    " or expert " + std::to_string(expert) +
                                                    " out of range");
    return static_cast<std::size_t>(language) * static_cast<std::size_t>(experts_) +
           static_cast<std::size_t>(expert);
  }
  std::vector<std::string> languages_;
  int experts_;
  std::vector<double> counts_;
};

namespace detail {

inline std::ofstream open_for_writing(const std::filesystem::path& path, std::string_view op) {
  std::error_code ec;
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ec);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw gshard::Error(op, "cannot write " + path.string());
  return out;
}

/// A path as a gnuplot single-quoted string (where only '' needs escaping).
inline std::string gnuplot_quoted(const std::filesystem::path& path) {
  std::string q = "'";
  for (const char c : path.string()) q += c == '\'' ? std::string("''") : std::string(1, c);
  return q + "'";
}

}  // namespace detail

/// Writes step,train_loss,aux_loss,held_out_loss; an empty held-out field where none was measured.
inline void write_loss_csv(const std::filesystem::path& path,
                           const std::vector<LossRecord>& records) {
  auto out = detail::open_for_writing(path, "moe_lm::write_loss_csv");
  out << "step,train_loss,aux_loss,held_out_loss\n";
  out.precision(9);
  for (const auto& r : records) {
    out << r.step << ',' << r.train_loss << ',' << r.aux_loss << ',';
    if (!std::isnan(r.held_out_loss)) out << r.held_out_loss;
    out << '\n';
  }
  if (!out) throw gshard::Error("moe_lm::write_loss_csv", "write failed: " + path.string());
}

/// Writes the expert-load matrix: a header "language,e0,e1,..." then one row of fractions per
/// language.
inline void write_load_csv(const std::filesystem::path& path, const ExpertLoad& load) {
  auto out = detail::open_for_writing(path, "moe_lm::write_load_csv");
  out << "language";
  for (int e = 0; e < load.experts(); ++e) out << ",e" << e;
  out << '\n';
  out.precision(6);
  for (std::size_t l = 0; l < load.languages().size(); ++l) {
    out << load.languages()[l];
    for (int e = 0; e < load.experts(); ++e) out << ',' << load.fraction(static_cast<int>(l), e);
    out << '\n';
  }
  if (!out) throw gshard::Error("moe_lm::write_load_csv", "write failed: " + path.string());
}

/// The gnuplot executable on PATH, or empty.
inline std::string find_gnuplot() {
  const char* path = std::getenv("PATH");
  std::stringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    const auto candidate = std::filesystem::path(dir.empty() ? "." : dir) / "gnuplot";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return {};
}

/// Runs gnuplot on `script` (saved next to the PNG as <png>.gp, so a plot can be redrawn by hand).
/// Throws, with gnuplot's messages, when it is missing, fails or leaves no PNG.
inline void run_gnuplot(const std::string& script, const std::filesystem::path& png) {
  const std::string op = "moe_lm::plot";
  const std::string gnuplot = find_gnuplot();
  if (gnuplot.empty())
    throw gshard::Error(op, "gnuplot not found on PATH, needed to draw " + png.string() +
                                ": install the Debian package gnuplot-nox "
                                "(scripts/install-deps.sh demo)");
  const std::filesystem::path script_path = png.string() + ".gp";
  const std::filesystem::path log_path = png.string() + ".log";
  {
    auto out = detail::open_for_writing(script_path, op);
    out << script;
  }
  std::error_code ec;
  std::filesystem::remove(png, ec);
  // posix_spawn, not system(): no shell to quote for, and it is safe in an MPI process.
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  std::string arg0 = gnuplot, arg1 = script_path.string();
  char* argv[] = {arg0.data(), arg1.data(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, gnuplot.c_str(), &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0)
    throw gshard::Error(op, "cannot start " + gnuplot + ": " + std::strerror(spawned));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  std::ifstream log_in(log_path);
  const std::string log{std::istreambuf_iterator<char>(log_in), std::istreambuf_iterator<char>()};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !std::filesystem::exists(png))
    throw gshard::Error(op, "gnuplot failed on " + script_path.string() + ": " + log);
}

/// Plots loss.csv (write_loss_csv's format): train and held-out loss against the step, the
/// auxiliary loss on a second axis.
inline void plot_loss_png(const std::filesystem::path& csv, const std::filesystem::path& png,
                          const std::string& title = "moe_lm: loss per byte") {
  std::ostringstream s;
  s << "set terminal pngcairo size 1000,600 noenhanced\n"
    << "set output " << detail::gnuplot_quoted(png) << "\n"
    << "set datafile separator ','\n"
    << "set title " << detail::gnuplot_quoted(title) << "\n"
    << "set key top right\nset grid\n"
    << "set xlabel 'step'\nset ylabel 'loss (nats/byte)'\nset y2label 'auxiliary loss'\n"
    << "set ytics nomirror\nset y2tics\n"
    // "using 1:4" (not "($4)") skips the empty held-out fields and joins the measured points.
    << "plot " << detail::gnuplot_quoted(csv)
    << " using 1:2 skip 1 with lines lw 1.5 title 'train',"
    << " '' using 1:4 skip 1 with linespoints lw 2 pt 7 title 'held-out',"
    << " '' using 1:3 skip 1 axes x1y2 with lines dt 2 title 'aux (right axis)'\n";
  run_gnuplot(s.str(), png);
}

/// Plots expert_load.csv (write_load_csv's format) as a heatmap: languages x experts, each cell
/// the fraction of the language's tokens routed to the expert, printed in the cell.
inline void plot_load_png(const std::filesystem::path& csv, const std::filesystem::path& png,
                          const std::string& title = "moe_lm: expert load per language") {
  std::ostringstream s;
  const std::string data = detail::gnuplot_quoted(csv);
  s << "set terminal pngcairo size 1000,600 noenhanced\n"
    << "set output " << detail::gnuplot_quoted(png) << "\n"
    << "set datafile separator ','\n"
    << "set title " << detail::gnuplot_quoted(title) << "\n"
    << "set xlabel 'expert'\nset ylabel 'language'\nset cblabel 'fraction of tokens'\n"
    << "set yrange [] reverse\nset cbrange [0:*]\nset tics out nomirror\n"
    << "set palette defined (0 'white', 1 '#f0c060', 2 '#d05020')\n"
    << "plot " << data << " matrix rowheaders columnheaders using 1:2:3 with image notitle,"
    << " '' matrix rowheaders columnheaders using 1:2:(sprintf('%.2f', $3)) with labels "
       "notitle\n";
  run_gnuplot(s.str(), png);
}

/// "1h02m", "7m05s", "42s".
inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || !std::isfinite(seconds)) return "?";
  const auto t = static_cast<std::int64_t>(std::llround(seconds));
  char text[32];
  if (t >= 3600)
    std::snprintf(text, sizeof text, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t % 3600 / 60));
  else if (t >= 60)
    std::snprintf(text, sizeof text, "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  else
    std::snprintf(text, sizeof text, "%llds", static_cast<long long>(t));
  return text;
}

/// Seconds left: the steps to go at the pace so far, or the time limit if that ends sooner.
inline double estimate_eta(std::int64_t step, std::int64_t steps, double elapsed_s,
                           double time_limit_s = 0) {
  if (step <= 0) return std::nan("");
  double eta = elapsed_s / static_cast<double>(step) * static_cast<double>(steps - step);
  if (time_limit_s > 0) eta = std::min(eta, std::max(0.0, time_limit_s - elapsed_s));
  return eta;
}

/// --steps 0: the step count that fills the time limit, from the first `done` steps. `step_s`:
/// seconds per step after the first (which pays one-off set-up); `eval_s`: one held-out
/// evaluation, run every `eval_every` steps and at the end; `now_s`: seconds since start, where the
/// limit `time_limit_s` also counts from. Keeps 3% of the limit and one step in hand (main.cpp
/// refits at each evaluation), so the time limit stays the backstop, not the stop.
/// At least done + 1 and warmup + 1.
inline std::int64_t fit_steps(std::int64_t done, double step_s, double eval_s, int eval_every,
                              double now_s, double time_limit_s, std::int64_t warmup) {
  const double left = time_limit_s * 0.97 - now_s - step_s - eval_s;
  const double per_step = step_s + eval_s / std::max(1, eval_every);
  const double more = per_step > 0 ? std::floor(std::max(0.0, left) / per_step) : 0.0;
  const auto fitted = done + static_cast<std::int64_t>(std::min(more, 1e12));
  return std::max({fitted, done + 1, warmup + 1});
}

/// What a progress line shows.
struct Progress {
  std::int64_t step = 0, steps = 0;
  double loss = 0, aux_loss = 0;
  double dropped = 0;  // fraction of token-to-expert assignments over capacity
  double tokens_per_s = 0;
  double eta_s = 0;
};

/// "step   120/600  loss 2.3456  aux 1.0123  dropped  1.20%  4,512 tok/s  ETA 7m05s".
inline std::string format_progress(const Progress& p) {
  const auto width = std::to_string(p.steps).size();
  const auto rate = static_cast<std::int64_t>(std::llround(std::max(0.0, p.tokens_per_s)));
  const std::string digits = std::to_string(rate);
  std::string grouped;  // built forwards: GCC 12's -Wrestrict misfires on string::insert here
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  char text[256];
  std::snprintf(
      text, sizeof text, "step %*lld/%lld  loss %.4f  aux %.4f  dropped %5.2f%%  %s tok/s  ETA %s",
      static_cast<int>(width), static_cast<long long>(p.step), static_cast<long long>(p.steps),
      p.loss, p.aux_loss, 100.0 * p.dropped, grouped.c_str(), format_duration(p.eta_s).c_str());
  return text;
}

/// "held-out  step 100  loss 2.8765 nats/byte  (en 2.71 de 2.80 ...)"; per_language may be empty.
inline std::string format_held_out(std::int64_t step, double loss,
                                   const std::vector<std::string>& codes = {},
                                   const std::vector<double>& per_language = {}) {
  char text[96];
  std::snprintf(text, sizeof text, "held-out  step %lld  loss %.4f nats/byte",
                static_cast<long long>(step), loss);
  std::string line = text;
  if (!per_language.empty() && codes.size() == per_language.size()) {
    line += "  (";
    for (std::size_t i = 0; i < codes.size(); ++i) {
      std::snprintf(text, sizeof text, "%s%s %.2f", i ? " " : "", codes[i].c_str(),
                    per_language[i]);
      line += text;
    }
    line += ")";
  }
  return line;
}

/// Generated bytes made safe to print: valid UTF-8 is kept, an invalid byte becomes U+FFFD, and
/// control bytes other than newline and tab become a middle dot.
inline std::string printable(std::string_view bytes) {
  std::string out;
  std::size_t i = 0;
  while (i < bytes.size()) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    std::size_t len = c < 0x80           ? 1
                      : (c >> 5) == 0x6  ? 2
                      : (c >> 4) == 0xE  ? 3
                      : (c >> 3) == 0x1E ? 4
                                         : 0;
    if (len > 1 && c < 0xC2) len = 0;  // overlong two-byte lead
    bool ok = len > 0 && i + len <= bytes.size();
    for (std::size_t k = 1; ok && k < len; ++k)
      ok = (static_cast<unsigned char>(bytes[i + k]) & 0xC0) == 0x80;
    if (!ok) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else if (len == 1 && (c < 0x20 || c == 0x7F) && c != '\n' && c != '\t') {
      out += "\xC2\xB7";
      ++i;
    } else {
      out.append(bytes.substr(i, len));
      i += len;
    }
  }
  return out;
}

}  // namespace moe_lm
