#pragma once
// A string usable as a template argument: mesh axis names and layout specs live in types.
#include <cstddef>
#include <string_view>

namespace gshard {

template <std::size_t N>
struct fixed_string {
  char data[N]{};  // NUL-terminated

  constexpr fixed_string(const char (&text)[N]) {  // NOLINT: implicit on purpose
    for (std::size_t i = 0; i < N; ++i) data[i] = text[i];
  }
  constexpr fixed_string() = default;

  [[nodiscard]] constexpr std::size_t size() const noexcept { return N - 1; }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {data, N - 1}; }
  constexpr operator std::string_view() const noexcept { return view(); }  // NOLINT
};

template <std::size_t A, std::size_t B>
constexpr bool operator==(const fixed_string<A>& a, const fixed_string<B>& b) {
  return a.view() == b.view();
}

namespace detail {
// A fixed_string holding exactly `text`, for naming an offending piece in a diagnostic.
template <std::size_t N>
constexpr fixed_string<N + 1> make_fixed(std::string_view text) {
  fixed_string<N + 1> out;
  for (std::size_t i = 0; i < N && i < text.size(); ++i) out.data[i] = text[i];
  return out;
}
}  // namespace detail

}  // namespace gshard
