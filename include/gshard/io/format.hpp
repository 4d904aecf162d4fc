#pragma once
// File formats of tensor I/O: safetensors and .npy headers, parsed and validated before anything
// trusts them, and written. Standard library and nlohmann-json only (no MPI, no Kokkos), so the
// fuzz targets (tests/fuzz) build these readers alone.
//
// A reader takes the header's bytes and the file's size and either returns a header whose every
// offset, size and shape is consistent with that file, or throws gshard::Error saying what is
// wrong. Nothing here allocates more than the header's own size.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "../core/error.hpp"

namespace gshard::io {

/// One tensor's element type as the file names it.
struct DType {
  std::string name;       // safetensors: "F32"; .npy: the descr, "<f4"
  std::size_t bytes = 0;  // element size
};

/// The safetensors name of an element type we read and write.
template <class T>
constexpr std::string_view safetensors_dtype() {
  if constexpr (std::is_same_v<T, float>)
    return "F32";
  else if constexpr (std::is_same_v<T, double>)
    return "F64";
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return "I32";
  else {
    static_assert(std::is_same_v<T, std::int64_t>, "gshard::io: float, double, int32_t or int64_t");
    return "I64";
  }
}

/// The .npy descr (little-endian) of an element type we read and write.
template <class T>
constexpr std::string_view npy_descr() {
  if constexpr (std::is_same_v<T, float>)
    return "<f4";
  else if constexpr (std::is_same_v<T, double>)
    return "<f8";
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return "<i4";
  else {
    static_assert(std::is_same_v<T, std::int64_t>, "gshard::io: float, double, int32_t or int64_t");
    return "<i8";
  }
}

namespace detail {

inline std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i)
    s.append(i ? ", " : "").append(std::to_string(shape[i]));
  return s + "]";
}

/// Elements of `shape` times `bytes`, or an error when that overflows 64 bits.
inline std::uint64_t byte_size(const std::vector<std::int64_t>& shape, std::size_t bytes,
                               std::string_view op, std::string_view what) {
  std::uint64_t n = bytes;
  for (const std::int64_t d : shape) {
    if (d < 0)
      throw Error(
          op, std::string(what).append(": negative dimension in shape ").append(shape_text(shape)));
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n))
      throw Error(op, std::string(what)
                          .append(": shape ")
                          .append(shape_text(shape))
                          .append(" overflows 64 bits"));
  }
  return n;
}

inline std::uint64_t read_le(const unsigned char* p, int bytes) {
  std::uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

inline void write_le(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// safetensors: u64 little-endian header length N, N bytes of JSON, then the tensors' bytes.
// The JSON maps each name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets from the
// first data byte) and may hold "__metadata__": {string: string}. Like the reference reader we
// require the tensors to tile the data exactly, in offset order, without gaps.

/// One tensor's entry in a safetensors header.
struct SafetensorsEntry {
  std::string name;
  DType dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;  // byte offsets from the first data byte
  std::uint64_t end = 0;
};

struct SafetensorsHeader {
  std::uint64_t json_bytes = 0;           // N
  std::vector<SafetensorsEntry> tensors;  // in offset order
  std::map<std::string, std::string> metadata;
  [[nodiscard]] std::uint64_t data_start() const { return 8 + json_bytes; }
  [[nodiscard]] const SafetensorsEntry* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

/// The largest header we accept (the reference reader's limit).
inline constexpr std::uint64_t safetensors_max_header = 100'000'000;

/// Element size of a safetensors dtype name; 0 when unknown.
inline std::size_t safetensors_dtype_bytes(std::string_view name) {
  static constexpr std::pair<std::string_view, std::size_t> known[] = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"F64", 8}, {"I64", 8},     {"U64", 8}};
  for (const auto& [n, b] : known)
    if (n == name) return b;
  return 0;
}

/// N from the first 8 bytes, checked against the file's size.
inline std::uint64_t safetensors_header_length(std::span<const char> first8,
                                               std::uint64_t file_size, std::string_view file) {
  const std::string op = "read_safetensors";
  if (first8.size() < 8 || file_size < 8)
    throw Error(
        op, std::string(file)
                .append(": ")
                .append(std::to_string(file_size))
                .append(" bytes, too short for a safetensors file (8-byte header length first)"));
  const std::uint64_t n = detail::read_le(reinterpret_cast<const unsigned char*>(first8.data()), 8);
  if (n > safetensors_max_header || n > file_size - 8)
    throw Error(op, std::string(file)
                        .append(": header length ")
                        .append(std::to_string(n))
                        .append(" does not fit a file of ")
                        .append(std::to_string(file_size))
                        .append(" bytes (limit ")
                        .append(std::to_string(safetensors_max_header))
                        .append("): truncated or not a safetensors file"));
  return n;
}

/// Parses and validates the JSON header (the N bytes after the length) of a file of file_size
/// bytes. Throws gshard::Error naming the file and the first problem found.
inline SafetensorsHeader parse_safetensors_header(std::span<const char> json,
                                                  std::uint64_t file_size, std::string_view file) {
  const std::string op = "read_safetensors";
  const std::string where = std::string(file).append(": ");
  auto fail = [&](const std::string& what) { throw Error(op, where + what); };
  SafetensorsHeader h;
  h.json_bytes = json.size();
  if (file_size < 8 || json.size() > file_size - 8) fail("header longer than the file");
  const std::uint64_t data_bytes = file_size - 8 - json.size();
  const nlohmann::json doc = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (doc.is_discarded()) fail("the header is not valid JSON");
  if (!doc.is_object()) fail("the header is not a JSON object");
  for (const auto& [key, value] : doc.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("\"__metadata__\" is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail("metadata \"" + mk + "\" is not a string");
        h.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    const std::string what = "tensor \"" + key + "\"";
    if (!value.is_object()) fail(what + " is not an object");
    const auto dt = value.find("dtype");
    const auto sh = value.find("shape");
    const auto off = value.find("data_offsets");
    if (dt == value.end() || sh == value.end() || off == value.end())
      fail(what + " lacks \"dtype\", \"shape\" or \"data_offsets\"");
    if (!dt->is_string()) fail(what + ": \"dtype\" is not a string");
    SafetensorsEntry e;
    e.name = key;
    e.dtype.name = dt->get<std::string>();
    e.dtype.bytes = safetensors_dtype_bytes(e.dtype.name);
    if (e.dtype.bytes == 0) fail(what + ": unknown dtype \"" + e.dtype.name + "\"");
    if (!sh->is_array()) fail(what + ": \"shape\" is not an array");
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned() ||
          d.get<std::uint64_t>() >
              static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        fail(what + ": \"shape\" holds " + d.dump() + ", not a non-negative integer");
      e.shape.push_back(static_cast<std::int64_t>(d.get<std::uint64_t>()));
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      fail(what + ": \"data_offsets\" is not [begin, end] of non-negative integers");
    e.begin = (*off)[0].get<std::uint64_t>();
    e.end = (*off)[1].get<std::uint64_t>();
    if (e.begin > e.end || e.end > data_bytes)
      fail(what + ": data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) +
           "] outside the " + std::to_string(data_bytes) + " data bytes (truncated file?)");
    const std::uint64_t want = detail::byte_size(e.shape, e.dtype.bytes, op, where + what);
    if (e.end - e.begin != want)
      fail(what + ": " + std::to_string(e.end - e.begin) + " bytes for shape " +
           detail::shape_text(e.shape) + " of " + e.dtype.name + ", which needs " +
           std::to_string(want));
    h.tensors.push_back(std::move(e));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  for (const auto& t : h.tensors) {
    if (t.begin != at)
      fail("tensor \"" + t.name + "\" starts at byte " + std::to_string(t.begin) + ", expected " +
           std::to_string(at) + " (tensors must tile the data without gaps or overlaps)");
    at = t.end;
  }
  if (at != data_bytes)
    fail("the tensors cover " + std::to_string(at) + " of the " + std::to_string(data_bytes) +
         " data bytes");
  return h;
}

/// The header bytes (length + JSON, padded with spaces to a multiple of 8) of a file holding
/// `tensors` in the given order; their offsets are assigned here, back to back.
inline std::string make_safetensors_header(std::vector<SafetensorsEntry>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json doc = nlohmann::ordered_json::object();
  if (!metadata.empty()) doc["__metadata__"] = metadata;
  std::uint64_t at = 0;
  for (auto& t : tensors) {
    t.begin = at;
    t.end = at + detail::byte_size(t.shape, t.dtype.bytes, "write_safetensors", t.name);
    at = t.end;
    if (doc.contains(t.name) || t.name == "__metadata__")
      throw Error("write_safetensors", "tensor name \"" + t.name + "\" used twice or reserved");
    doc[t.name] = {{"dtype", t.dtype.name}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string json = doc.dump();
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out;
  detail::write_le(out, json.size(), 8);
  return out + json;
}

// ---------------------------------------------------------------------------------------------
// .npy: "\x93NUMPY", version (1, 2 or 3).0, header length (u16 in version 1, u32 after), and a
// Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
// spaces and a newline. We read C-order arrays of a little-endian (or byte-sized) dtype.

struct NpyHeader {
  DType dtype;                      // descr, e.g. "<f4"
  std::vector<std::int64_t> shape;  // () is a scalar
  std::uint64_t data_start = 0;     // byte offset of the first element
  std::uint64_t data_bytes = 0;
};

namespace detail {

/// A strict reader of the dict literal numpy writes: string keys; string, True/False and
/// tuple-of-integer values; nothing else.
class NpyDictReader {
 public:
  NpyDictReader(std::string_view text, std::string where) : s_(text), where_(std::move(where)) {}

  NpyHeader read() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    expect('{');
    while (true) {
      skip();
      if (peek() == '}') break;
      const std::string key = string();
      expect(':');
      skip();
      if (key == "descr") {
        h.dtype.name = string();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (boolean())
          fail("fortran_order is True: only C-order arrays are read (np.ascontiguousarray)");
        have_order = true;
      } else if (key == "shape") {
        h.shape = tuple();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip();
      if (peek() != '}') fail("expected ',' or '}'");
    }
    ++i_;
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\0')) ++i_;
    if (i_ != s_.size()) fail("bytes after the header dict");
    if (!have_descr || !have_order || !have_shape)
      fail("needs 'descr', 'fortran_order' and 'shape'");
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error("read_npy",
                where_ + "malformed header at byte " + std::to_string(i_) + ": " + what);
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip() {
    while (i_ < s_.size() && s_[i_] == ' ') ++i_;
  }
  void expect(char c) {
    skip();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string() {
    skip();
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a string");
    const std::size_t start = ++i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' || static_cast<unsigned char>(s_[i_]) < 0x20)
        fail("unsupported character in a string");
      ++i_;
    }
    if (i_ >= s_.size()) fail("unterminated string");
    return std::string(s_.substr(start, i_++ - start));
  }
  bool boolean() {
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("expected True or False");
  }
  std::vector<std::int64_t> tuple() {
    std::vector<std::int64_t> out;
    expect('(');
    while (true) {
      skip();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("expected a non-negative integer in the shape");
      std::int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
          fail("a dimension overflows 64 bits");
        ++i_;
      }
      if (peek() == 'L') ++i_;  // Python 2's long suffix
      out.push_back(v);
      if (out.size() > 64) fail("more than 64 dimensions");
      skip();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip();
      if (peek() != ')') fail("expected ',' or ')' in the shape");
    }
    ++i_;
    return out;
  }

  std::string_view s_;
  std::string where_;
  std::size_t i_ = 0;
};

}  // namespace detail

/// Bytes a reader needs before parse_npy_header can see the whole header (the prefix gives it).
inline constexpr std::size_t npy_prefix_bytes = 12;

/// Parses and validates a .npy header. `prefix` holds the file's first bytes: at least
/// npy_header_length(...) of them. Throws gshard::Error naming the file and the problem.
inline std::uint64_t npy_header_length(std::span<const char> prefix, std::uint64_t file_size,
                                       std::string_view file) {
  const std::string where = std::string(file).append(": ");
  static constexpr char magic[] = "\x93NUMPY";
  if (prefix.size() < 10 || file_size < 10 || std::memcmp(prefix.data(), magic, 6) != 0)
    throw Error("read_npy", where + "not a .npy file (no \\x93NUMPY magic)");
  const auto* p = reinterpret_cast<const unsigned char*>(prefix.data());
  const int major = p[6];
  if (major < 1 || major > 3 || p[7] != 0)
    throw Error("read_npy", where + "unsupported .npy version " + std::to_string(major) + "." +
                                std::to_string(p[7]));
  const std::uint64_t len =
      major == 1 ? detail::read_le(p + 8, 2)
                 : (prefix.size() < 12 ? ~std::uint64_t{0} : detail::read_le(p + 8, 4));
  const std::uint64_t start = (major == 1 ? 10 : 12) + len;
  if (len == ~std::uint64_t{0} || len > 1'000'000 || start > file_size)
    throw Error("read_npy", where + "header length does not fit the file of " +
                                std::to_string(file_size) + " bytes (truncated?)");
  return start;
}

/// The header of a .npy file of file_size bytes whose first npy_header_length() bytes are
/// `header` (magic included).
inline NpyHeader parse_npy_header(std::span<const char> header, std::uint64_t file_size,
                                  std::string_view file) {
  const std::string where = std::string(file).append(": ");
  const std::uint64_t start = npy_header_length(header, file_size, file);
  if (header.size() < start) throw Error("read_npy", where + "header cut short");
  const std::size_t dict_at = header[6] == 1 ? 10 : 12;
  NpyHeader h =
      detail::NpyDictReader(std::string_view(header.data() + dict_at, start - dict_at), where)
          .read();
  h.data_start = start;
  const std::string& d = h.dtype.name;
  const bool known = d.size() == 3 && (d[0] == '<' || d[0] == '|') &&
                     (d[1] == 'f' || d[1] == 'i' || d[1] == 'u' || d[1] == 'b') && d[2] >= '1' &&
                     d[2] <= '8';
  if (!known) throw Error("read_npy", where + "dtype '" + d + "' is not a little-endian number");
  h.dtype.bytes = static_cast<std::size_t>(d[2] - '0');
  h.data_bytes = detail::byte_size(h.shape, h.dtype.bytes, "read_npy", where + "shape");
  if (h.data_bytes != file_size - start)
    throw Error("read_npy", where + "shape " + detail::shape_text(h.shape) + " of '" + d +
                                "' needs " + std::to_string(h.data_bytes) +
                                " bytes, the file holds " + std::to_string(file_size - start) +
                                " after its header");
  return h;
}

/// A version 1.0 header (version 2.0 when it does not fit), padded to a multiple of 64 bytes.
inline std::string make_npy_header(std::string_view descr, const std::vector<std::int64_t>& shape) {
  std::string dict = "{'descr': '";
  dict.append(descr).append("', 'fortran_order': False, 'shape': (");
  for (std::size_t i = 0; i < shape.size(); ++i)
    dict.append(i ? ", " : "").append(std::to_string(shape[i]));
  dict.append(shape.size() == 1 ? ",), }" : "), }");
  const bool v1 = dict.size() + 11 < 65535;
  const std::size_t fixed = v1 ? 10 : 12;
  std::size_t total = fixed + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - fixed - dict.size() - 1, ' ').push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(static_cast<char>(v1 ? 1 : 2));
  out.push_back('\0');
  detail::write_le(out, dict.size(), v1 ? 2 : 4);
  return out + dict;
}

// ---------------------------------------------------------------------------------------------
// Checksums: a sum over elements of a hash of (global flat index, element bits), modulo 2^64.
// Any split of a tensor into blocks adds up to the same value, so each rank hashes what it
// writes or reads and one sum (MPI_UINT64_T, MPI_SUM) gives the tensor's checksum.

inline std::uint64_t mix64(std::uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

template <class T>
std::uint64_t element_hash(std::uint64_t index, T value) {
  std::uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  return mix64(bits + mix64(index + 0x9e3779b97f4a7c15ULL));
}

}  // namespace gshard::io
