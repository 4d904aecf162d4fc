#pragma once
// What the benchmarks share: the median of repetitions and the parsing of list options.
#include <algorithm>
#include <string>
#include <vector>

namespace bench {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The non-empty pieces of s between separators `by` ("1,4,16" -> {"1", "4", "16"}).
inline std::vector<std::string> split(const std::string& s, char by) {
  std::vector<std::string> out;
  std::size_t p = 0;
  while (p <= s.size()) {
    const std::size_t q = std::min(s.find(by, p), s.size());
    if (q > p) out.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

}  // namespace bench
