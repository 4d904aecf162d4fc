#pragma once
// The arithmetic operators of sharded values and lazy expressions, declared where both can use
// them. Each class that is a gshard expression puts GSHARD_EXPRESSION_OPERATORS(Self) in its body:
// hidden friends whose left (or only) operand is a Located<Self>, so that the implicit conversion
// records the user's source line (operators cannot take a defaulted source_location themselves).
// The bodies call detail::elementwise, defined in expr/elementwise.hpp.
#include <source_location>
#include <type_traits>

namespace gshard {

/// A gshard value with the source line where it was used.
template <class E>
struct Located {
  const E& value;
  std::source_location where;
  Located(const E& e,  // NOLINT: implicit on purpose, that is how the line is captured
          std::source_location w = std::source_location::current())
      : value(e), where(w) {}
};

/// Sharded tensors and lazy expressions.
template <class E>
concept Expression = requires {
  E::is_gshard_expression;
}
&&E::is_gshard_expression;

/// A materialised tensor (a gshard::Sharded), not a lazy expression.
template <class E>
concept ShardedTensor = Expression<E> && !E::is_lazy;

template <class E>
concept Operand = Expression<E> || std::is_arithmetic_v<E>;

namespace op {
struct Add;
struct Sub;
struct Mul;
struct Div;
struct Neg;
}  // namespace op

namespace detail {
template <class Op, class... Args>
auto elementwise(std::source_location where, const Args&... args);
}  // namespace detail

}  // namespace gshard

#define GSHARD_BINARY_OPERATOR(Self, sym, Op)                                    \
  template <::gshard::Operand GshardRhs>                                         \
  friend auto operator sym(::gshard::Located<Self> a, const GshardRhs& b) {      \
    return ::gshard::detail::elementwise<::gshard::op::Op>(a.where, a.value, b); \
  }                                                                              \
  template <class GshardScalar>                                                  \
  requires std::is_arithmetic_v<GshardScalar>                                    \
  friend auto operator sym(GshardScalar s, ::gshard::Located<Self> b) {          \
    return ::gshard::detail::elementwise<::gshard::op::Op>(b.where, s, b.value); \
  }

/// + - * / (with another expression or a scalar on either side) and unary minus, for Self.
#define GSHARD_EXPRESSION_OPERATORS(Self)                                      \
  GSHARD_BINARY_OPERATOR(Self, +, Add)                                         \
  GSHARD_BINARY_OPERATOR(Self, -, Sub)                                         \
  GSHARD_BINARY_OPERATOR(Self, *, Mul)                                         \
  GSHARD_BINARY_OPERATOR(Self, /, Div)                                         \
  friend auto operator-(::gshard::Located<Self> a) {                           \
    return ::gshard::detail::elementwise<::gshard::op::Neg>(a.where, a.value); \
  }
