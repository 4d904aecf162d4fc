// The main job's non-model parts (examples/moe_lm: corpus.hpp, cli.hpp, report.hpp) on the
// installed fortune packages: every language found, the streams balanced, held-out and train
// cookies disjoint, every window inside its language's cookies, the sampler a pure function of
// (seed, step) that every rank computes identically, the unigram entropy against a naive count
// and against an equal-weight mixture of the languages computed from this file's own parse of the
// fortune files; then the command line, the formatters, and CSV -> PNG through gnuplot.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mpi_test.hpp"

#include "../../../examples/moe_lm/cli.hpp"
#include "../../../examples/moe_lm/corpus.hpp"
#include "../../../examples/moe_lm/report.hpp"

namespace {

namespace fs = std::filesystem;
using gshard::test::world_rank;
using gshard::test::world_size;
using Int = std::int64_t;

const std::vector<std::string> kCodes = {"en", "de", "es", "it", "ru", "pl", "cs", "zh"};

const moe_lm::Corpus& corpus() {
  static const moe_lm::Corpus c = moe_lm::load_corpus();
  return c;
}

// --- an independent reading of the fortune files ----------------------------------------------

// Line by line: CR dropped, ECMA-48 CSI sequences removed (whole or cut short, as fortunes-zh
// has "ESC[;ESC[34;1m"), a line "%" ends a cookie.
std::vector<std::string> naive_cookies(const std::string& path) {
  static const std::regex csi("\x1b\\[[0-?]*[ -/]*[@-~]?");
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::vector<std::string> cookies;
  std::string line, current;
  const auto flush = [&] {
    if (current.find_first_not_of(" \t\r\n\f\v") != std::string::npos) cookies.push_back(current);
    current.clear();
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line == "%") {
      flush();
      continue;
    }
    if (line.find('\x1b') != std::string::npos) line = std::regex_replace(line, csi, "");
    current += line + "\n";
  }
  flush();
  return cookies;
}

struct NaiveLanguage {
  std::vector<std::string> all, train, held;
  std::multiset<std::string> counts;      // every cookie text, for duplicates
  std::string joined_train, joined_held;  // cookies each ended by '\0'
};

const std::vector<NaiveLanguage>& naive() {
  static const std::vector<NaiveLanguage> langs = [] {
    std::vector<NaiveLanguage> out;
    for (const auto& lang : corpus().languages) {
      NaiveLanguage n;
      for (const auto& f : lang.files)
        for (auto& c : naive_cookies(f)) n.all.push_back(std::move(c));
      for (std::size_t i = 0; i < n.all.size(); ++i) {
        const bool held = moe_lm::is_held_out(lang.code, static_cast<Int>(i), 10);
        (held ? n.held : n.train).push_back(n.all[i]);
        (held ? n.joined_held : n.joined_train) += n.all[i] + '\0';
        n.counts.insert(n.all[i]);
      }
      out.push_back(std::move(n));
    }
    return out;
  }();
  return langs;
}

// A stream cut at its cookie ends ("\n%\n"): whole cookies, then what follows the last end.
std::vector<std::string> pieces(const std::string& stream) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  for (;;) {
    const std::size_t end = stream.find("\n%\n", pos);
    if (end == std::string::npos) break;
    out.push_back(stream.substr(pos, end + 1 - pos));
    pos = end + 3;
  }
  out.push_back(stream.substr(pos));
  return out;
}

std::uint64_t fnv(const void* data, std::size_t bytes, std::uint64_t h = 1469598103934665603ULL) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  return h;
}

std::uint64_t batch_hash(const moe_lm::Batch& b) {
  std::uint64_t h = fnv(b.tokens.data(), b.tokens.size() * sizeof(b.tokens[0]));
  h = fnv(b.language.data(), b.language.size() * sizeof(int), h);
  return fnv(b.offset.data(), b.offset.size() * sizeof(Int), h);
}

bool same_on_every_rank(std::uint64_t value) {
  unsigned long long lo = value, hi = value;
  MPI_Allreduce(MPI_IN_PLACE, &lo, 1, MPI_UNSIGNED_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
  MPI_Allreduce(MPI_IN_PLACE, &hi, 1, MPI_UNSIGNED_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
  return lo == hi;
}

double entropy_of(const std::array<double, 256>& p) {
  double h = 0;
  for (const double v : p)
    if (v > 0) h -= v * std::log(v);
  return h;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

bool is_png(const fs::path& path) {
  const std::string head = read_all(path).substr(0, 8);
  return head == std::string("\x89PNG\r\n\x1a\n", 8);
}

fs::path scratch_dir() {
  const fs::path dir =
      fs::temp_directory_path() / ("gshard_moe_lm_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir;
}

}  // namespace

TEST_CASE("moe_lm corpus: parse_cookies") {
  const std::string text =
      "first\r\nline 50%\r\n%\n \n\t\n%\n\x1b[33mred\x1b[m and \x1b[;\x1b[34;1mmblue\n%\n%\nlast "
      "without newline";
  const std::vector<std::string> want = {"first\nline 50%\n", "red and mblue\n",
                                         "last without newline\n"};
  CHECK(moe_lm::parse_cookies(text) == want);
  CHECK(moe_lm::parse_cookies("%\n%\n").empty());
  CHECK(moe_lm::parse_cookies("\xd0\x9f\xff\n") == std::vector<std::string>{"\xd0\x9f\xff\n"});
}

TEST_CASE("moe_lm corpus: every language found, from its own package's files") {
  const auto& c = corpus();
  REQUIRE(c.languages.size() == kCodes.size());
  const std::map<std::string, std::string> must_have = {
      {"en", "cookie"}, {"de", "zitate"}, {"es", "refranes.fortunes"},
      {"it", "italia"}, {"ru", "murphy"}, {"pl", "dowcipy"},
      {"cs", "citace"}, {"zh", "tang300"}};
  for (std::size_t l = 0; l < kCodes.size(); ++l) {
    const auto& lang = c.languages[l];
    CAPTURE(lang.code);
    CHECK(lang.code == kCodes[l]);
    CHECK(!lang.files.empty());
    std::set<std::string> names;
    for (const auto& f : lang.files) {
      CAPTURE(f);
      const fs::path p(f);
      names.insert(p.filename().string());
      CHECK(fs::is_regular_file(fs::symlink_status(p)));  // not a symlink to a duplicate
      CHECK(p.extension() != ".dat");
      CHECK(p.extension() != ".u8");
      CHECK(p.parent_path().filename() != "off");
    }
    CHECK(names.count(must_have.at(lang.code)) == 1);
    // English shares its directory with Chinese and with fortunes-it's symlinks.
    if (lang.code == "en") {
      CHECK(names.count("chinese") == 0);
      CHECK(names.count("italia") == 0);
    }
    if (lang.code == "zh") CHECK(names == std::set<std::string>{"chinese", "song100", "tang300"});
    // The same cookies as this file's own parser finds.
    CHECK(lang.cookies == static_cast<Int>(naive()[l].all.size()));
    CHECK(lang.train_cookies == static_cast<Int>(naive()[l].train.size()));
    CHECK(lang.held_out_cookies == static_cast<Int>(naive()[l].held.size()));
    CHECK(lang.cookies > 1000);
  }
}

TEST_CASE("moe_lm corpus: a missing language names its package") {
  auto sources = moe_lm::default_sources();
  sources[3].dir = "/nonexistent/fortunes/it";
  try {
    (void)moe_lm::load_corpus({sources, 10});
    FAIL("no error for a missing language");
  } catch (const gshard::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("fortunes-it") != std::string::npos);
    CHECK(what.find("Italian") != std::string::npos);
  }
  sources = moe_lm::default_sources();
  sources.back().only = {"no-such-file"};
  CHECK_THROWS_WITH_AS((void)moe_lm::load_corpus({sources, 10}), doctest::Contains("fortunes-zh"),
                       gshard::Error);
}

TEST_CASE("moe_lm corpus: balanced bytes, held-out and train disjoint") {
  const auto& c = corpus();
  Int min_train = INT64_MAX, min_held = INT64_MAX;
  for (std::size_t l = 0; l < c.languages.size(); ++l) {
    const auto& lang = c.languages[l];
    const auto& n = naive()[l];
    CAPTURE(lang.code);
    Int train_bytes = 0, held_bytes = 0;
    for (const auto& s : n.train) train_bytes += static_cast<Int>(s.size()) + 2;
    for (const auto& s : n.held) held_bytes += static_cast<Int>(s.size()) + 2;
    CHECK(lang.full_train_bytes == train_bytes);
    CHECK(lang.full_held_out_bytes == held_bytes);
    min_train = std::min(min_train, train_bytes);
    min_held = std::min(min_held, held_bytes);
    // About one cookie in ten held out, spread by the hash.
    const double share = static_cast<double>(n.held.size()) / static_cast<double>(n.all.size());
    CHECK(share > 0.08);
    CHECK(share < 0.12);
  }
  CHECK(c.train_bytes == min_train);
  CHECK(c.held_out_bytes == min_held);
  for (std::size_t l = 0; l < c.languages.size(); ++l) {
    const auto& lang = c.languages[l];
    const auto& n = naive()[l];
    CAPTURE(lang.code);
    CHECK(static_cast<Int>(lang.train.size()) == c.train_bytes);
    CHECK(static_cast<Int>(lang.held_out.size()) == c.held_out_bytes);
    const std::set<std::string> train_set(n.train.begin(), n.train.end());
    const std::set<std::string> held_set(n.held.begin(), n.held.end());
    // Whole cookies of each stream come from its own split, each once; a text in both splits
    // must be a cookie the files hold twice.
    for (const auto* split : {&lang.train, &lang.held_out}) {
      const bool is_train = split == &lang.train;
      auto parts = pieces(*split);
      const std::string tail = parts.back();
      parts.pop_back();
      CHECK(parts.size() > 100);
      std::map<std::string, std::size_t> uses;
      for (const auto& p : parts) {
        CHECK((is_train ? train_set : held_set).count(p) == 1);
        if ((is_train ? held_set : train_set).count(p) == 1) CHECK(n.counts.count(p) >= 2);
        ++uses[p];
      }
      for (const auto& [text, times] : uses) CHECK(times <= n.counts.count(text));
      // The cut cookie is the start of one of the split's cookies.
      const auto& joined = is_train ? n.joined_train : n.joined_held;
      CHECK(joined.find(std::string(1, '\0') + tail) != std::string::npos);
    }
  }
}

TEST_CASE("moe_lm sampler: pure in (seed, step), the same on every rank, windows in cookies") {
  const auto& c = corpus();
  const Int batch = 12, context = 64;
  const auto L = static_cast<Int>(c.languages.size());
  std::vector<Int> rows_per_language(static_cast<std::size_t>(L), 0);
  for (const auto split : {moe_lm::Split::train, moe_lm::Split::held_out}) {
    for (Int step : {Int{0}, Int{1}, Int{7}, Int{1000}}) {
      CAPTURE(step);
      const auto a = moe_lm::sample_batch(c, split, 42, step, batch, context);
      const auto b = moe_lm::sample_batch(c, split, 42, step, batch, context);
      CHECK(batch_hash(a) == batch_hash(b));
      CHECK(same_on_every_rank(batch_hash(a)));
      CHECK(batch_hash(a) != batch_hash(moe_lm::sample_batch(c, split, 43, step, batch, context)));
      CHECK(batch_hash(a) !=
            batch_hash(moe_lm::sample_batch(c, split, 42, step + 1, batch, context)));
      REQUIRE(a.tokens.size() == static_cast<std::size_t>(batch * (context + 1)));
      for (Int r = 0; r < batch; ++r) {
        const int lang = a.language[static_cast<std::size_t>(r)];
        CHECK(lang == (step * batch + r) % L);
        if (split == moe_lm::Split::train) ++rows_per_language[static_cast<std::size_t>(lang)];
        const Int offset = a.offset[static_cast<std::size_t>(r)];
        const auto& stream = split == moe_lm::Split::train
                                 ? c.languages[static_cast<std::size_t>(lang)].train
                                 : c.languages[static_cast<std::size_t>(lang)].held_out;
        REQUIRE(offset >= 0);
        REQUIRE(offset + context + 1 <= static_cast<Int>(stream.size()));
        std::string window;
        for (Int t = 0; t <= context; ++t) {
          const auto token = a.token(r, t);
          REQUIRE(token >= 0);
          REQUIRE(token < moe_lm::kVocabulary);
          window += static_cast<char>(token);
        }
        CHECK(window == stream.substr(static_cast<std::size_t>(offset),
                                      static_cast<std::size_t>(context + 1)));
        // Every piece of the window lies inside a cookie of this language and split; the inner
        // pieces are whole cookies.
        const auto& n = naive()[static_cast<std::size_t>(lang)];
        const auto& joined = split == moe_lm::Split::train ? n.joined_train : n.joined_held;
        const auto& cookies = split == moe_lm::Split::train ? n.train : n.held;
        std::vector<std::string> parts;
        std::size_t pos = 0;
        for (;;) {
          const std::size_t end = window.find("\n%\n", pos);
          if (end == std::string::npos) break;
          parts.push_back(window.substr(pos, end + 1 - pos));
          pos = end + 3;
        }
        parts.push_back(window.substr(pos));
        for (std::size_t i = 0; i < parts.size(); ++i) {
          CAPTURE(parts[i]);
          if (parts[i].empty() || parts[i] == "\n%" || parts[i] == "%" || parts[i] == "\n")
            continue;  // a window may start or end inside a separator
          std::string p = parts[i];
          // A window may start inside the separator before a cookie.
          if (i == 0 && p.rfind("%\n", 0) == 0) p = p.substr(2);
          if (i == 0 && p[0] == '\n' && joined.find(p) == std::string::npos) p = p.substr(1);
          if (i + 1 == parts.size() && p.size() >= 2 && p.substr(p.size() - 2) == "\n%")
            p.pop_back();
          CHECK(joined.find(p) != std::string::npos);
          if (i > 0 && i + 1 < parts.size())
            CHECK(std::find(cookies.begin(), cookies.end(), p) != cookies.end());
        }
      }
    }
  }
  // Rows cycle through the languages.
  const auto [lo, hi] = std::minmax_element(rows_per_language.begin(), rows_per_language.end());
  CHECK(*hi - *lo <= 1);
  // Windows cover a stream: over many steps, starts fall in both halves of it.
  Int low_half = 0;
  for (Int s = 0; s < 64; ++s)
    for (const auto o : moe_lm::sample_batch(c, moe_lm::Split::train, 1, s, 8, 32).offset)
      low_half += o < c.train_bytes / 2;
  CHECK(low_half > 512 / 4);
  CHECK(low_half < 512 * 3 / 4);
  CHECK_THROWS_AS((void)moe_lm::sample_batch(c, moe_lm::Split::held_out, 1, 0, 2, c.held_out_bytes),
                  gshard::Error);
}

TEST_CASE("moe_lm sampler: data shards tile the global batch") {
  const auto& c = corpus();
  const auto global = moe_lm::sample_batch(c, moe_lm::Split::train, 5, 3, 13, 16);
  for (int shards = 1; shards <= 8; ++shards) {
    CAPTURE(shards);
    std::vector<std::int32_t> tokens;
    std::vector<int> languages;
    Int expected_first = 0;
    const Int chunk = (13 + shards - 1) / shards;
    for (int i = 0; i < shards; ++i) {
      const auto rows = moe_lm::data_rows(13, shards, i);
      CHECK(rows.first == std::min<Int>(13, i * chunk));
      CHECK(rows.first == expected_first);
      CHECK(rows.count == std::max<Int>(0, std::min<Int>(chunk, 13 - i * chunk)));
      expected_first += rows.count;
      const auto part = moe_lm::slice_rows(global, rows);
      tokens.insert(tokens.end(), part.tokens.begin(), part.tokens.end());
      languages.insert(languages.end(), part.language.begin(), part.language.end());
    }
    CHECK(expected_first == 13);
    CHECK(tokens == global.tokens);
    CHECK(languages == global.language);
  }
  // This rank's shard on a data axis of world size, as a mesh would hand it out.
  const auto rows = moe_lm::data_rows(13, world_size(), world_rank());
  const auto mine = moe_lm::slice_rows(global, rows);
  for (Int r = 0; r < rows.count; ++r) CHECK(mine.token(r, 0) == global.token(rows.first + r, 0));
}

TEST_CASE("moe_lm corpus: unigram entropy of the balanced corpus") {
  const auto& c = corpus();
  // A naive count over the balanced streams.
  std::array<double, 256> p{};
  double total = 0;
  for (const auto& lang : c.languages)
    for (const unsigned char b : lang.train) p[b] += 1, total += 1;
  for (auto& v : p) v /= total;
  const double h = moe_lm::unigram_entropy(c);
  CHECK(h == doctest::Approx(entropy_of(p)).epsilon(1e-12));
  // The equal-weight mixture of each language's whole training split, from this file's parse:
  // the balanced streams are a large sample of it.
  std::array<double, 256> mix{};
  for (const auto& n : naive()) {
    std::array<double, 256> q{};
    double bytes = 0;
    for (const auto& cookie : n.train) {
      for (const unsigned char b : cookie) q[b] += 1;
      q['%'] += 1, q['\n'] += 1;
      bytes += static_cast<double>(cookie.size() + 2);
    }
    for (std::size_t b = 0; b < 256; ++b)
      mix[b] += q[b] / bytes / static_cast<double>(naive().size());
  }
  const double h_mix = entropy_of(mix);
  MESSAGE("unigram entropy: balanced corpus " << h << " nats/byte, equal-weight mixture of the "
                                              << "full splits " << h_mix);
  CHECK(std::abs(h - h_mix) < 0.03);
  CHECK(h > 3.8);  // the issue measured 4.0 on this corpus
  CHECK(h < 4.2);
  CHECK(same_on_every_rank(fnv(&h, sizeof h)));
}

TEST_CASE("moe_lm corpus: prompts are whole UTF-8 text of the held-out split") {
  const auto& c = corpus();
  for (int l = 0; l < static_cast<int>(c.languages.size()); ++l) {
    for (const std::size_t bytes : {std::size_t{1}, std::size_t{7}, std::size_t{40}}) {
      const auto prompt = moe_lm::prompt_for(c, l, bytes);
      CHECK(prompt.size() <= bytes);
      CHECK(c.languages[static_cast<std::size_t>(l)].held_out.rfind(prompt, 0) == 0);
      CHECK(moe_lm::printable(prompt) == prompt);  // valid UTF-8, nothing replaced
    }
    CHECK(!moe_lm::prompt_for(c, l, 40).empty());
  }
}

TEST_CASE("moe_lm cli: defaults, options, --help and mistakes") {
  const auto parse = [](std::vector<std::string> args, moe_lm::Options& o) {
    args.insert(args.begin(), "moe_lm");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return moe_lm::parse_options(o, static_cast<int>(argv.size()), argv.data(), false);
  };
  moe_lm::Options o;
  CHECK(!parse({}, o).has_value());
  CHECK(o.mesh_shape == std::vector<int>{2, 2});
  CHECK(o.d_model == 128);
  CHECK(o.layers == 4);
  CHECK(o.experts == 8);
  CHECK(o.context == 128);
  CHECK(o.batch == 32);
  CHECK(o.steps == 0);  // fitted to the time limit
  CHECK(o.time_limit > 0);
  moe_lm::Options p;
  CHECK(!parse({"--mesh",
                "4x2x1",
                "--d-model",
                "64",
                "--heads",
                "2",
                "--experts",
                "4",
                "--capacity-factor",
                "1.5",
                "--lr",
                "0.01",
                "--seed",
                "9",
                "--out",
                "x",
                "--checkpoint-dir",
                "ck",
                "--steps",
                "20",
                "--eval-every",
                "5"},
               p)
             .has_value());
  CHECK(p.mesh_shape == std::vector<int>{4, 2, 1});
  CHECK(moe_lm::mesh_ranks(p.mesh_shape) == 8);
  CHECK(p.d_model == 64);
  CHECK(p.experts == 4);
  CHECK(p.capacity_factor == 1.5);
  CHECK(p.lr == 0.01);
  CHECK(p.seed == 9);
  CHECK(p.out == "x");
  CHECK(p.checkpoint_dir == "ck");
  CHECK(p.steps == 20);
  CHECK(p.eval_every == 5);
  moe_lm::Options q;
  CHECK(parse({"--help"}, q) == std::optional<int>(0));
  for (const auto& bad :
       std::vector<std::vector<std::string>>{{"--mesh", "4"},
                                             {"--mesh", "2x0"},
                                             {"--mesh", "2x2x2x2"},
                                             {"--mesh", "2xx2"},
                                             {"--steps", "-1"},
                                             {"--steps", "0", "--time-limit", "0"},
                                             {"--heads", "3"},
                                             {"--no-such-option"},
                                             {"--lr", "fast"}}) {
    moe_lm::Options r;
    CAPTURE(bad[0]);
    const auto code = parse(bad, r);
    REQUIRE(code.has_value());
    CHECK(*code != 0);
  }
}

TEST_CASE("moe_lm report: formatters and the expert-load matrix") {
  const std::string line =
      moe_lm::format_progress({120, 600, 2.34567, 1.0123, 0.0125, 4512.4, 425});
  CHECK(line == "step 120/600  loss 2.3457  aux 1.0123  dropped  1.25%  4,512 tok/s  ETA 7m05s");
  CHECK(moe_lm::format_duration(3725) == "1h02m");
  CHECK(moe_lm::format_duration(42.4) == "42s");
  CHECK(moe_lm::estimate_eta(100, 600, 50.0) == doctest::Approx(250.0));
  CHECK(moe_lm::estimate_eta(100, 600, 50.0, 200.0) == doctest::Approx(150.0));
  // --steps 0: 0.97 * 560 - 20 s so far - one step and one evaluation in hand = 519.7 s, at
  // 0.5 s per step plus a 3 s evaluation every 50 steps (0.56 s) = 928 more steps.
  CHECK(moe_lm::fit_steps(10, 0.5, 3.0, 50, 20.0, 560.0, 50) == 938);
  CHECK(moe_lm::fit_steps(10, 100.0, 0.0, 50, 500.0, 560.0, 50) == 51);  // past the limit
  CHECK(moe_lm::fit_steps(60, 100.0, 0.0, 50, 500.0, 560.0, 50) == 61);
  CHECK(moe_lm::format_held_out(50, 3.25, {"en", "de"}, {3.0, 3.5}) ==
        "held-out  step 50  loss 3.2500 nats/byte  (en 3.00 de 3.50)");
  CHECK(moe_lm::printable("a\x01\xff\xc3\xa9\n") == "a\xC2\xB7\xEF\xBF\xBD\xC3\xA9\n");
  moe_lm::ExpertLoad load({"en", "de"}, 3);
  load.add(0, 0, 3);
  load.add(0, 2, 1);
  load.add(1, 1, 5);
  CHECK(load.fraction(0, 0) == doctest::Approx(0.75));
  CHECK(load.fraction(0, 1) == 0.0);
  CHECK(load.fraction(1, 1) == doctest::Approx(1.0));
  CHECK_THROWS_AS(load.add(2, 0), gshard::Error);
  CHECK_THROWS_AS(load.add(0, 3), gshard::Error);
}

TEST_CASE("moe_lm report: CSV files and PNG plots drawn by gnuplot") {
  if (world_rank() != 0) return;  // one plotter is enough; nothing here communicates
  const fs::path dir = scratch_dir();
  std::vector<moe_lm::LossRecord> records;
  for (Int s = 1; s <= 40; ++s)
    records.push_back({s, 5.5 - 0.07 * static_cast<double>(s), 1.0 + 1.0 / static_cast<double>(s),
                       s % 10 == 0 ? 5.6 - 0.07 * static_cast<double>(s) : std::nan("")});
  moe_lm::write_loss_csv(dir / "loss.csv", records);
  std::istringstream csv(read_all(dir / "loss.csv"));
  std::string row;
  std::getline(csv, row);
  CHECK(row == "step,train_loss,aux_loss,held_out_loss");
  std::getline(csv, row);
  CHECK(row == "1,5.43,2,");
  for (int i = 0; i < 9; ++i) std::getline(csv, row);
  CHECK(row == "10,4.8,1.1,4.9");
  moe_lm::ExpertLoad load({"en", "de", "zh"}, 4);
  for (int l = 0; l < 3; ++l)
    for (int e = 0; e < 4; ++e) load.add(l, e, 1 + l * e);
  moe_lm::write_load_csv(dir / "load.csv", load);
  CHECK(read_all(dir / "load.csv") ==
        "language,e0,e1,e2,e3\nen,0.25,0.25,0.25,0.25\nde,0.1,0.2,0.3,0.4\n"
        "zh,0.0625,0.1875,0.3125,0.4375\n");

  // Without gnuplot on PATH the error names the package.
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  ::setenv("PATH", (dir / "empty").c_str(), 1);
  CHECK_THROWS_WITH_AS(moe_lm::plot_loss_png(dir / "loss.csv", dir / "none.png"),
                       doctest::Contains("gnuplot-nox"), gshard::Error);
  ::setenv("PATH", path.c_str(), 1);
  if (moe_lm::find_gnuplot().empty()) {
    MESSAGE("gnuplot not installed (scripts/install-deps.sh test): PNG checks skipped");
  } else {
    moe_lm::plot_loss_png(dir / "loss.csv", dir / "loss.png");
    CHECK(is_png(dir / "loss.png"));
    moe_lm::plot_load_png(dir / "load.csv", dir / "load.png");
    CHECK(is_png(dir / "load.png"));
    CHECK(fs::file_size(dir / "load.png") > 1000);
    // A broken input reaches the caller with gnuplot's own message.
    CHECK_THROWS_WITH_AS(moe_lm::plot_loss_png(dir / "missing.csv", dir / "bad.png"),
                         doctest::Contains("gnuplot failed"), gshard::Error);
  }
  fs::remove_all(dir);
}
