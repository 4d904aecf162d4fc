#pragma once
// A string usable as a template argument: mesh axis names and layout specs live in types.
//
// One non-template structural type of fixed capacity, not a class template fixed_string<N>:
// nvcc cannot deduce a template parameter whose type is a class template placeholder
// (`template <fixed_string<N> S> f(Sharded<T, M, S>)` fails deduction there), while every
// compiler deduces a parameter of one concrete type. Diagnostics show the exact-size `literal<N>`
// instead (detail::shown), which g++ and clang both print as a quoted string.
#include <cstddef>
#include <string_view>
#include <type_traits>

namespace gshard {

struct fixed_string {
  static constexpr std::size_t capacity = 64;  // characters, the terminating NUL included
  char data[capacity]{};  // NUL-padded, so equal text means equal value (template identity)

  template <std::size_t N>
  constexpr fixed_string(const char (&text)[N]) {  // NOLINT: implicit on purpose
    static_assert(N <= capacity,
                  "gshard: a layout spec, einsum or axis name is longer than 63 characters");
    for (std::size_t i = 0; i + 1 < N; ++i) data[i] = text[i];
  }
  constexpr explicit fixed_string(std::string_view text) {
    for (std::size_t i = 0; i < text.size() && i + 1 < capacity; ++i) data[i] = text[i];
  }
  constexpr fixed_string() = default;

  [[nodiscard]] constexpr std::size_t size() const noexcept {
    std::size_t n = 0;
    while (n < capacity && data[n] != '\0') ++n;
    return n;
  }
  [[nodiscard]] constexpr std::string_view view() const noexcept { return {data, size()}; }
  constexpr operator std::string_view() const noexcept { return view(); }  // NOLINT

  friend constexpr bool operator==(const fixed_string&, const fixed_string&) = default;
};

/// The exact-size string a compile-time diagnostic shows: g++ and clang print it as "text"
/// (clang prints a NUL-padded array as a list of integers).
template <std::size_t N>
struct literal {
  char data[N]{};
  constexpr literal(const char (&text)[N]) {  // NOLINT: implicit on purpose
    for (std::size_t i = 0; i < N; ++i) data[i] = text[i];
  }
  constexpr literal() = default;
};

namespace detail {
// A fixed_string holding exactly `text`, for naming an offending piece in a diagnostic.
template <std::size_t N>
constexpr fixed_string make_fixed(std::string_view text) {
  return fixed_string(text.substr(0, N));
}

template <auto V>
constexpr auto show() {
  if constexpr (std::is_same_v<std::remove_cv_t<decltype(V)>, fixed_string>) {
    literal<V.size() + 1> out;
    for (std::size_t i = 0; i < V.size(); ++i) out.data[i] = V.data[i];
    out.data[V.size()] = '\0';  // written, not left to {}: clang prints it as "text" only then
    return out;
  } else {
    return V;
  }
}
/// What a diagnostic template is instantiated with: strings as literal<N>, other values as is.
template <auto V>
inline constexpr auto shown = show<V>();
}  // namespace detail

}  // namespace gshard
