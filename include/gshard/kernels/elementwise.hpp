#pragma once
// Elementwise ops and the one kernel that runs a fused chain of them.
//
// An op is a small device functor with a name and a linearity class (which says whether pending
// partial sums may stay pending through it, expr/elementwise.hpp). A fused chain is a tree of
// evaluators: leaves read an input block through strides in the output's dimension order (0 for a
// label the input lacks: broadcasting by label), inner nodes apply an op. The kernel walks the
// output block row by row (all dimensions but the last), so each leaf computes its row address
// once per row, and writes zeros into the padding.
#include <Kokkos_Core.hpp>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../core/layout.hpp"
#include "math.hpp"

namespace gshard {

/// How an op treats pending partial sums (values still to be summed over a mesh axis).
enum class Linearity {
  none,       // f(a + b) != f(a) + f(b): partial inputs are summed first
  sum,        // +, -, negation: partial tensor inputs with the same pending axes stay pending
  scale,      // a product with scalars: stays pending when exactly one operand is a tensor
  numerator,  // a quotient: stays pending when only the numerator is a tensor
};

namespace op {
#define GSHARD_OP(text, lin)                             \
  static constexpr const char* name = text;              \
  static constexpr Linearity linearity = Linearity::lin; \
  static constexpr bool floating_only = false

struct Add {
  GSHARD_OP("add", sum);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a + b;
  }
};
struct Sub {
  GSHARD_OP("sub", sum);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a - b;
  }
};
struct Mul {
  GSHARD_OP("mul", scale);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a * b;
  }
};
struct Div {
  GSHARD_OP("div", numerator);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a / b;
  }
};
struct Neg {
  GSHARD_OP("neg", sum);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return -a;
  }
};
struct Abs {
  GSHARD_OP("abs", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return a < A(0) ? A(-a) : a;
  }
};
struct Square {
  GSHARD_OP("square", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return a * a;
  }
};
struct Relu {
  GSHARD_OP("relu", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return a > A(0) ? a : A(0);
  }
};
struct Minimum {
  GSHARD_OP("minimum", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return b < a ? b : a;
  }
};
struct Maximum {
  GSHARD_OP("maximum", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a < b ? b : a;
  }
};
/// where(c, a, b): a where c is non-zero, else b.
struct Where {
  GSHARD_OP("where", none);
  static constexpr std::size_t first_typed_operand = 1;  // the condition may be of any type
  template <class C, class A>
  KOKKOS_INLINE_FUNCTION A operator()(C c, A a, A b) const {
    return c != C(0) ? a : b;
  }
};
template <class U>
struct Cast {
  GSHARD_OP("cast", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION U operator()(A a) const {
    return static_cast<U>(a);
  }
};
#undef GSHARD_OP

#define GSHARD_FLOAT_OP(Name, text, body)                   \
  struct Name {                                             \
    static constexpr const char* name = text;               \
    static constexpr Linearity linearity = Linearity::none; \
    static constexpr bool floating_only = true;             \
    template <class A>                                      \
    KOKKOS_INLINE_FUNCTION A operator()(A x) const {        \
      return body;                                          \
    }                                                       \
  }
GSHARD_FLOAT_OP(Exp, "exp", math::exp(x));
GSHARD_FLOAT_OP(Log, "log", math::log(x));
GSHARD_FLOAT_OP(Sqrt, "sqrt", math::sqrt(x));
GSHARD_FLOAT_OP(Rsqrt, "rsqrt", A(1) / math::sqrt(x));
GSHARD_FLOAT_OP(Tanh, "tanh", math::tanh(x));
GSHARD_FLOAT_OP(Sigmoid, "sigmoid", A(1) / (A(1) + math::exp(-x)));
// The exact (erf) form, as PyTorch's default gelu.
GSHARD_FLOAT_OP(Gelu, "gelu", A(0.5) * x * (A(1) + math::erf(x * A(0.70710678118654752440))));
#undef GSHARD_FLOAT_OP

struct Pow {
  static constexpr const char* name = "pow";
  static constexpr Linearity linearity = Linearity::none;
  static constexpr bool floating_only = true;
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A x, A y) const {
    return math::pow(x, y);
  }
};
}  // namespace op

namespace detail {

/// A leaf of a fused chain: an input block read through strides in the output's dimension order.
template <class T>
struct LeafEval {
  const T* data = nullptr;
  std::int64_t base = 0;  // offset of the output block's origin in this input's block
  std::int64_t stride[max_dims]{};
  int rank = 0;  // the output's rank
  const T* row_start = nullptr;

  KOKKOS_INLINE_FUNCTION void row(const std::int64_t* idx) {
    std::int64_t off = base;
    for (int d = 0; d + 1 < rank; ++d) off += idx[d] * stride[d];
    row_start = data + off;
  }
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t j) const {
    return row_start[j * stride[rank > 0 ? rank - 1 : 0]];
  }
};

template <class T>
struct ScalarEval {
  T value{};
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t*) {}
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t) const { return value; }
};

template <class Op, class... K>
struct MapEval;
template <class Op, class A>
struct MapEval<Op, A> {
  Op op;
  A a;
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t* idx) { a.row(idx); }
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t j) const { return op(a(j)); }
};
template <class Op, class A, class B>
struct MapEval<Op, A, B> {
  Op op;
  A a;
  B b;
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t* idx) {
    a.row(idx);
    b.row(idx);
  }
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t j) const { return op(a(j), b(j)); }
};
template <class Op, class A, class B, class C>
struct MapEval<Op, A, B, C> {
  Op op;
  A a;
  B b;
  C c;
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t* idx) {
    a.row(idx);
    b.row(idx);
    c.row(idx);
  }
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t j) const { return op(a(j), b(j), c(j)); }
};

/// The output block of a fused kernel: padded extents, and how much of each is real.
struct FusedBlock {
  int rank = 0;
  std::int64_t extent[max_dims]{};
  std::int64_t valid[max_dims]{};
};

/// out = ev over the whole padded block: ONE kernel launch, zeros in the padding.
template <class T, class Ev>
void run_fused(const Ev& ev, T* out, const FusedBlock& g) {
  const int r = g.rank;
  const std::int64_t last = r > 0 ? g.extent[r - 1] : 1;
  const std::int64_t last_valid = r > 0 ? g.valid[r - 1] : 1;
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < r; ++d) rows *= g.extent[d];
  if (rows * last == 0) return;
  Kokkos::parallel_for(
      "gshard::elementwise", Kokkos::RangePolicy<>(0, rows), KOKKOS_LAMBDA(std::int64_t row) {
        std::int64_t idx[max_dims]{};
        bool real = true;
        for (std::int64_t d = r - 2, rest = row; d >= 0; --d) {
          idx[d] = rest % g.extent[d];
          rest /= g.extent[d];
          real = real && idx[d] < g.valid[d];
        }
        T* dst = out + row * last;
        const std::int64_t n = real ? last_valid : 0;
        Ev e = ev;
        e.row(idx);
        for (std::int64_t j = 0; j < n; ++j) dst[j] = static_cast<T>(e(j));
        for (std::int64_t j = n; j < last; ++j) dst[j] = T(0);
      });
}

}  // namespace detail
}  // namespace gshard
