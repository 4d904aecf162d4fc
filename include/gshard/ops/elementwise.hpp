#pragma once
// Elementwise ops on sharded tensors and expressions: lazy, fused into one kernel per chain,
// broadcast by label (expr/elementwise.hpp has the layout rules). Also the operators + - * /.
#include <source_location>

#include "../expr/elementwise.hpp"
#include "../expr/explain.hpp"

namespace gshard {

#define GSHARD_UNARY_FUNCTION(fn, Op)                                                 \
  template <Expression E>                                                             \
  auto fn(const E& x, std::source_location where = std::source_location::current()) { \
    return detail::elementwise<op::Op>(where, x);                                     \
  }
GSHARD_UNARY_FUNCTION(neg, Neg)
GSHARD_UNARY_FUNCTION(abs, Abs)
GSHARD_UNARY_FUNCTION(square, Square)
GSHARD_UNARY_FUNCTION(relu, Relu)
GSHARD_UNARY_FUNCTION(exp, Exp)
GSHARD_UNARY_FUNCTION(log, Log)
GSHARD_UNARY_FUNCTION(sqrt, Sqrt)
GSHARD_UNARY_FUNCTION(rsqrt, Rsqrt)
GSHARD_UNARY_FUNCTION(tanh, Tanh)
GSHARD_UNARY_FUNCTION(sigmoid, Sigmoid)
GSHARD_UNARY_FUNCTION(gelu, Gelu)
#undef GSHARD_UNARY_FUNCTION

#define GSHARD_BINARY_FUNCTION(fn, Op)                                                        \
  template <Operand A, Operand B>                                                             \
  requires(Expression<A> || Expression<B>) auto fn(                                           \
      const A& a, const B& b, std::source_location where = std::source_location::current()) { \
    return detail::elementwise<op::Op>(where, a, b);                                          \
  }
GSHARD_BINARY_FUNCTION(pow, Pow)
GSHARD_BINARY_FUNCTION(minimum, Minimum)
GSHARD_BINARY_FUNCTION(maximum, Maximum)
#undef GSHARD_BINARY_FUNCTION

/// a where `condition` is non-zero, else b; a and b may be scalars, the condition any type.
template <Expression C, Operand A, Operand B>
requires(Expression<A> ||
         Expression<B>) auto where(const C& condition, const A& a, const B& b,
                                   std::source_location loc = std::source_location::current()) {
  return detail::elementwise<op::Where>(loc, condition, a, b);
}

/// The values converted to element type U (float, double, int32_t, int64_t).
template <ElementType U, Expression E>
auto cast(const E& x, std::source_location where = std::source_location::current()) {
  return detail::elementwise<op::Cast<U>>(where, x);
}

}  // namespace gshard
