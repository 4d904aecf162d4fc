#pragma once
// The main job's data: Debian's fortune cookies in eight languages, read as raw bytes (vocabulary
// 256, nothing decoded), balanced across languages, split into train and held-out cookies, and a
// batch sampler that is a pure function of (seed, step), so every rank and every mesh draws the
// same global batch and each rank then takes its shard.
//
// Balance: every language's training stream is cut to the smallest language's size (bytes), and
// batch rows cycle through the languages, so each language gets the same number of windows and
// every byte of the balanced corpus is equally likely to be drawn: the unigram entropy of the
// balanced corpus is then exactly that of the bytes the model is trained on.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gshard/core/error.hpp>

namespace moe_lm {

/// Byte-level model: tokens are the bytes 0..255.
inline constexpr int kVocabulary = 256;

/// Where one language's cookies live. With `only` empty, every regular file in `dir` is read
/// (not subdirectories such as the offensive 'off/', not symlinks, not the .dat/.u8 indexes), less
/// the names in `exclude`; otherwise exactly the files named in `only`.
struct LanguageSource {
  std::string code;     // "en", "de", ...
  std::string name;     // "English", ...
  std::string package;  // the Debian package that ships it
  std::string dir;
  std::vector<std::string> only;
  std::vector<std::string> exclude;
};

/// Debian 12's layout. English and Chinese share the top directory; fortunes-it also drops
/// symlinks there (skipped as symlinks); klasik-sk in cs/ is Slovak and stays out.
inline std::vector<LanguageSource> default_sources(
    const std::string& root = "/usr/share/games/fortunes") {
  const std::vector<std::string> chinese = {"chinese", "song100", "tang300"};
  return {
      {"en", "English", "fortunes", root, {}, chinese},
      {"de", "German", "fortunes-de", root + "/de", {}, {}},
      {"es", "Spanish", "fortunes-es", root + "/es", {}, {}},
      {"it", "Italian", "fortunes-it", root + "/it", {}, {}},
      {"ru", "Russian", "fortunes-ru", root + "/ru", {}, {}},
      {"pl", "Polish", "fortunes-pl", root + "/pl", {}, {}},
      {"cs", "Czech", "fortunes-cs", root + "/cs", {}, {"klasik-sk"}},
      {"zh", "Chinese", "fortunes-zh", root, chinese, {}},
  };
}

namespace detail {

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline std::uint64_t hash_of(std::string_view text) {  // FNV-1a, stable across platforms
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : text) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

inline bool ends_with(std::string_view s, std::string_view tail) {
  return s.size() >= tail.size() && s.substr(s.size() - tail.size()) == tail;
}

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw gshard::Error("moe_lm::load_corpus", "cannot read " + path.string());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline bool blank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  });
}

}  // namespace detail

/// Splits a fortune file into cookies: a line holding only '%' ends one. CRLF becomes LF and the
/// ANSI colour sequences some files carry (fortunes-zh's ESC '[' ... 'm') are dropped, as they are
/// markup, not text; every byte else is kept. Each cookie keeps its final '\n'; blank cookies are
/// skipped.
inline std::vector<std::string> parse_cookies(std::string_view text) {
  std::vector<std::string> cookies;
  std::string current;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    const bool has_newline = end != std::string_view::npos;
    if (!has_newline) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = has_newline ? end + 1 : end;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line == "%") {
      if (!detail::blank(current)) cookies.push_back(std::move(current));
      current.clear();
      continue;
    }
    for (std::size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\x1b' && i + 1 < line.size() && line[i + 1] == '[') {
        // ECMA-48 CSI: parameter bytes 0-?, intermediates space-/, one final byte @-~. A
        // sequence cut short (as by a second ESC) is dropped as a terminal would drop it.
        std::size_t j = i + 2;
        while (j < line.size() && line[j] >= '0' && line[j] <= '?') ++j;
        while (j < line.size() && line[j] >= ' ' && line[j] <= '/') ++j;
        if (j < line.size() && line[j] >= '@' && line[j] <= '~') ++j;
        i = j - 1;
        continue;
      }
      current.push_back(line[i]);
    }
    current.push_back('\n');
  }
  if (!detail::blank(current)) cookies.push_back(std::move(current));
  return cookies;
}

/// Joins cookies into one stream the way fortune files store them: each cookie then "%\n".
inline constexpr std::string_view kCookieSeparator = "%\n";

/// One language of the corpus.
struct Language {
  std::string code, name, package;
  std::vector<std::string> files;  // read, in name order
  std::int64_t cookies = 0;        // non-blank cookies in all files
  std::int64_t train_cookies = 0, held_out_cookies = 0;
  std::int64_t full_train_bytes = 0, full_held_out_bytes = 0;  // streams before balancing
  std::string train;     // balanced training stream: exactly Corpus::train_bytes bytes
  std::string held_out;  // balanced held-out stream: exactly Corpus::held_out_bytes bytes
};

struct CorpusOptions {
  std::vector<LanguageSource> sources = default_sources();
  int held_out_every = 10;  // about one cookie in this many is held out
};

struct Corpus {
  std::vector<Language> languages;
  std::int64_t train_bytes = 0;     // per language
  std::int64_t held_out_bytes = 0;  // per language
  int held_out_every = 10;
};

/// Whether cookie `index` of language `code` is held out: a hash of the index, so the split is
/// fixed by the installed files alone and spread over every file rather than taking whole ones.
inline bool is_held_out(std::string_view code, std::int64_t index, int every) {
  return detail::mix(detail::hash_of(code) ^ static_cast<std::uint64_t>(index)) %
             static_cast<std::uint64_t>(every) ==
         0;
}

/// The files a source names, sorted; throws naming the package when there are none.
inline std::vector<std::filesystem::path> source_files(const LanguageSource& source) {
  namespace fs = std::filesystem;
  const auto missing = [&](const std::string& why) {
    return gshard::Error("moe_lm::load_corpus", std::string("no ") + source.name + " fortunes (" +
                                                    why + "): install the Debian package " +
                                                    source.package +
                                                    " (scripts/install-deps.sh demo)");
  };
  std::vector<fs::path> files;
  std::error_code ec;
  if (!fs::is_directory(source.dir, ec)) throw missing(source.dir + " is not a directory");
  if (!source.only.empty()) {
    for (const auto& name : source.only) {
      const fs::path p = fs::path(source.dir) / name;
      if (!fs::is_regular_file(fs::symlink_status(p, ec))) throw missing(p.string() + " missing");
      files.push_back(p);
    }
  } else {
    for (const auto& entry : fs::directory_iterator(source.dir)) {
      if (!entry.is_regular_file() || entry.is_symlink()) continue;
      const std::string name = entry.path().filename().string();
      if (detail::ends_with(name, ".dat") || detail::ends_with(name, ".u8")) continue;
      if (std::find(source.exclude.begin(), source.exclude.end(), name) != source.exclude.end())
        continue;
      files.push_back(entry.path());
    }
    if (files.empty()) throw missing("no cookie files in " + source.dir);
  }
  std::sort(files.begin(), files.end());
  return files;
}

/// Reads, splits and balances the corpus. Deterministic: the same installed files give the same
/// streams on every rank.
inline Corpus load_corpus(const CorpusOptions& options = {}) {
  if (options.held_out_every < 2)
    throw gshard::Error("moe_lm::load_corpus", "held_out_every must be at least 2, got " +
                                                   std::to_string(options.held_out_every));
  if (options.sources.empty()) throw gshard::Error("moe_lm::load_corpus", "no languages");
  Corpus corpus;
  corpus.held_out_every = options.held_out_every;
  std::vector<std::vector<std::string>> train_cookies, held_cookies;
  for (const auto& source : options.sources) {
    Language lang{source.code, source.name, source.package, {}, 0, 0, 0, 0, 0, {}, {}};
    std::vector<std::string> train, held;
    std::int64_t index = 0;
    for (const auto& path : source_files(source)) {
      lang.files.push_back(path.string());
      for (auto& cookie : parse_cookies(detail::read_file(path))) {
        auto& part = is_held_out(source.code, index++, options.held_out_every) ? held : train;
        part.push_back(std::move(cookie));
      }
    }
    if (train.empty() || held.empty())
      throw gshard::Error("moe_lm::load_corpus", std::string("too few ") + source.name +
                                                     " cookies for a held-out split (package " +
                                                     source.package + ")");
    lang.cookies = index;
    lang.train_cookies = static_cast<std::int64_t>(train.size());
    lang.held_out_cookies = static_cast<std::int64_t>(held.size());
    for (const auto& c : train)
      lang.full_train_bytes += static_cast<std::int64_t>(c.size() + kCookieSeparator.size());
    for (const auto& c : held)
      lang.full_held_out_bytes += static_cast<std::int64_t>(c.size() + kCookieSeparator.size());
    corpus.languages.push_back(std::move(lang));
    train_cookies.push_back(std::move(train));
    held_cookies.push_back(std::move(held));
  }
  corpus.train_bytes = corpus.languages.front().full_train_bytes;
  corpus.held_out_bytes = corpus.languages.front().full_held_out_bytes;
  for (const auto& lang : corpus.languages) {
    corpus.train_bytes = std::min(corpus.train_bytes, lang.full_train_bytes);
    corpus.held_out_bytes = std::min(corpus.held_out_bytes, lang.full_held_out_bytes);
  }
  // Cookies in a hashed order, so the cut keeps a sample of every file rather than the first
  // files by name; the last cookie is cut so every stream has exactly the same size.
  const auto build = [](std::string_view code, const std::vector<std::string>& cookies,
                        std::int64_t bytes) {
    std::vector<std::pair<std::uint64_t, std::size_t>> order;
    for (std::size_t i = 0; i < cookies.size(); ++i)
      order.emplace_back(detail::mix(detail::hash_of(code) + 0x5151 + i), i);
    std::sort(order.begin(), order.end());
    std::string stream;
    stream.reserve(static_cast<std::size_t>(bytes));
    for (const auto& entry : order) {
      if (static_cast<std::int64_t>(stream.size()) >= bytes) break;
      stream.append(cookies[entry.second]).append(kCookieSeparator);
    }
    stream.resize(static_cast<std::size_t>(bytes));
    return stream;
  };
  for (std::size_t l = 0; l < corpus.languages.size(); ++l) {
    auto& lang = corpus.languages[l];
    lang.train = build(lang.code, train_cookies[l], corpus.train_bytes);
    lang.held_out = build(lang.code + "/held-out", held_cookies[l], corpus.held_out_bytes);
  }
  return corpus;
}

/// Byte counts of the balanced training streams of all languages together.
inline std::array<std::int64_t, kVocabulary> train_byte_counts(const Corpus& corpus) {
  std::array<std::int64_t, kVocabulary> counts{};
  for (const auto& lang : corpus.languages)
    for (const char c : lang.train) ++counts[static_cast<unsigned char>(c)];
  return counts;
}

/// Unigram entropy of the balanced training corpus, in nats per byte: what a model that knows
/// only byte frequencies would score.
inline double unigram_entropy(const Corpus& corpus) {
  const auto counts = train_byte_counts(corpus);
  double total = 0;
  for (const auto n : counts) total += static_cast<double>(n);
  double h = 0;
  for (const auto n : counts)
    if (n > 0) {
      const double p = static_cast<double>(n) / total;
      h -= p * std::log(p);
    }
  return h;
}

enum class Split { train, held_out };

/// A global batch of token windows. Row b holds context + 1 bytes of one language's stream
/// starting at offset[b]: inputs are tokens [0, context), targets tokens [1, context].
struct Batch {
  std::int64_t batch = 0, context = 0;
  std::vector<std::int32_t> tokens;  // [batch][context + 1], row-major
  std::vector<int> language;         // [batch], index into Corpus::languages
  std::vector<std::int64_t> offset;  // [batch], start of the window in its stream

  [[nodiscard]] std::int32_t token(std::int64_t b, std::int64_t t) const {
    return tokens[static_cast<std::size_t>(b * (context + 1) + t)];
  }
};

inline const std::string& stream_of(const Corpus& corpus, Split split, int language) {
  const auto& lang = corpus.languages[static_cast<std::size_t>(language)];
  return split == Split::train ? lang.train : lang.held_out;
}

namespace detail {

inline void check_batch_request(const Corpus& corpus, Split split, std::int64_t step,
                                std::int64_t batch, std::int64_t context, const char* op) {
  const std::int64_t stream_bytes =
      split == Split::train ? corpus.train_bytes : corpus.held_out_bytes;
  if (corpus.languages.empty() || batch < 1 || context < 1 || step < 0 ||
      stream_bytes < context + 1)
    throw gshard::Error(
        op,
        "need a loaded corpus, batch >= 1, context >= 1, step >= 0 and context + 1 <= stream "
        "bytes; got batch " +
            std::to_string(batch) + ", context " + std::to_string(context) + ", step " +
            std::to_string(step) + ", " + std::to_string(stream_bytes) + " bytes per stream");
}

/// Row b of the batch of `step` from language `lang`: its window starts at a hash of (seed,
/// split, step, b, salt), uniform over the stream.
inline void fill_row(const Corpus& corpus, Split split, std::uint64_t seed, std::int64_t step,
                     std::int64_t b, int lang, std::uint64_t salt, Batch& out) {
  const std::string& stream = stream_of(corpus, split, lang);
  const std::int64_t context = out.context;
  const auto starts =
      static_cast<std::uint64_t>(static_cast<std::int64_t>(stream.size()) - context);
  std::uint64_t h = mix(seed ^ salt ^ (split == Split::train ? 0x7261696eULL : 0x68656c64ULL));
  h = mix(h + static_cast<std::uint64_t>(step));
  h = mix(h + static_cast<std::uint64_t>(b));
  const auto start = static_cast<std::int64_t>(h % starts);
  out.language.push_back(lang);
  out.offset.push_back(start);
  for (std::int64_t t = 0; t <= context; ++t)
    out.tokens[static_cast<std::size_t>(b * (context + 1) + t)] =
        static_cast<unsigned char>(stream[static_cast<std::size_t>(start + t)]);
}

inline Batch empty_batch(std::int64_t batch, std::int64_t context) {
  Batch out;
  out.batch = batch;
  out.context = context;
  out.tokens.resize(static_cast<std::size_t>(batch * (context + 1)));
  return out;
}

}  // namespace detail

/// The global batch of `step`: a pure function of (corpus, split, seed, step, batch, context).
/// Row b's language cycles, (step * batch + b) mod languages, so languages get equal rows; its
/// window starts at a hash of (seed, split, step, b), uniform over the stream. Held-out batches
/// for evaluation are steps 0, 1, ... of Split::held_out with a fixed seed.
inline Batch sample_batch(const Corpus& corpus, Split split, std::uint64_t seed, std::int64_t step,
                          std::int64_t batch, std::int64_t context) {
  detail::check_batch_request(corpus, split, step, batch, context, "moe_lm::sample_batch");
  const auto languages = static_cast<std::int64_t>(corpus.languages.size());
  Batch out = detail::empty_batch(batch, context);
  for (std::int64_t b = 0; b < batch; ++b) {
    const auto lang = static_cast<int>(((step % languages) * (batch % languages) + b) % languages);
    detail::fill_row(corpus, split, seed, step, b, lang, 0, out);
  }
  return out;
}

/// Like sample_batch, but every row from one language (per-language held-out loss and expert
/// load). Its windows differ from sample_batch's (another salt).
inline Batch sample_language_batch(const Corpus& corpus, Split split, int language,
                                   std::uint64_t seed, std::int64_t step, std::int64_t batch,
                                   std::int64_t context) {
  detail::check_batch_request(corpus, split, step, batch, context, "moe_lm::sample_language_batch");
  if (language < 0 || static_cast<std::size_t>(language) >= corpus.languages.size())
    throw gshard::Error(
        "moe_lm::sample_language_batch",
        "language " + std::to_string(language) + " of " + std::to_string(corpus.languages.size()));
  Batch out = detail::empty_batch(batch, context);
  const std::uint64_t salt = detail::mix(0x6c616e67ULL + static_cast<std::uint64_t>(language));
  for (std::int64_t b = 0; b < batch; ++b)
    detail::fill_row(corpus, split, seed, step, b, language, salt, out);
  return out;
}

/// The rows [first, first + count) of the global batch that data shard `index` of `shards` holds:
/// gshard's uneven blocks, ceil(batch / shards) rows each, the last ones short or empty.
struct RowRange {
  std::int64_t first = 0, count = 0;
};

inline RowRange data_rows(std::int64_t batch, int shards, int index) {
  if (shards < 1 || index < 0 || index >= shards || batch < 0)
    throw gshard::Error("moe_lm::data_rows", "shard " + std::to_string(index) + " of " +
                                                 std::to_string(shards) + " for batch " +
                                                 std::to_string(batch));
  const std::int64_t chunk = (batch + shards - 1) / shards;
  const std::int64_t first = std::min(batch, chunk * index);
  return {first, std::min(chunk, batch - first)};
}

/// The rows of `rows` as a batch of their own (a data shard's part of the global batch).
inline Batch slice_rows(const Batch& batch, RowRange rows) {
  if (rows.first < 0 || rows.count < 0 || rows.first + rows.count > batch.batch)
    throw gshard::Error("moe_lm::slice_rows", "rows [" + std::to_string(rows.first) + ", " +
                                                  std::to_string(rows.first + rows.count) +
                                                  ") of a batch of " + std::to_string(batch.batch));
  Batch out;
  out.batch = rows.count;
  out.context = batch.context;
  const auto width = batch.context + 1;
  out.tokens.assign(batch.tokens.begin() + rows.first * width,
                    batch.tokens.begin() + (rows.first + rows.count) * width);
  out.language.assign(batch.language.begin() + rows.first,
                      batch.language.begin() + rows.first + rows.count);
  out.offset.assign(batch.offset.begin() + rows.first,
                    batch.offset.begin() + rows.first + rows.count);
  return out;
}

/// A prompt for sampling text in one language: the start of its first held-out cookie, at most
/// `bytes` long, cut back to a whole UTF-8 character.
inline std::string prompt_for(const Corpus& corpus, int language, std::size_t bytes) {
  const std::string& held = corpus.languages.at(static_cast<std::size_t>(language)).held_out;
  std::string text = held.substr(0, std::min({bytes, held.size(), held.find(kCookieSeparator)}));
  // Drop a last character the cut left incomplete.
  std::size_t lead = text.size();
  while (lead > 0 && (static_cast<unsigned char>(text[lead - 1]) & 0xC0) == 0x80) --lead;
  if (lead > 0) {
    const auto c = static_cast<unsigned char>(text[lead - 1]);
    const std::size_t want = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    if (text.size() - (lead - 1) < want) text.resize(lead - 1);
  }
  return text;
}

/// A one-paragraph summary: languages, cookies, files, balanced bytes and the unigram entropy.
inline std::string describe(const Corpus& corpus) {
  std::ostringstream out;
  out << "corpus: " << corpus.languages.size() << " languages, " << corpus.train_bytes
      << " train + " << corpus.held_out_bytes << " held-out bytes each (balanced), held out 1 in "
      << corpus.held_out_every << " cookies\n";
  for (const auto& lang : corpus.languages)
    out << "  " << lang.code << " " << lang.name << ": " << lang.files.size() << " files, "
        << lang.cookies << " cookies (" << lang.held_out_cookies << " held out), "
        << lang.full_train_bytes << " train bytes before balancing\n";
  out << "  unigram entropy of the balanced training corpus: " << unigram_entropy(corpus)
      << " nats/byte\n";
  return out.str();
}

}  // namespace moe_lm
