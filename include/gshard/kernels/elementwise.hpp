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
#include "../core/trace.hpp"
#include "math.hpp"
#include "rows.hpp"

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
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A, A, A da, A db) const {
    return da + db;
  }
};
struct Sub {
  GSHARD_OP("sub", sum);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a - b;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A, A, A da, A db) const {
    return da - db;
  }
};
struct Mul {
  GSHARD_OP("mul", scale);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a * b;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A a, A b, A da, A db) const {
    return da * b + a * db;
  }
};
struct Div {
  GSHARD_OP("div", numerator);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a / b;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A a, A b, A da, A db) const {
    return (da - a / b * db) / b;
  }
};
struct Neg {
  GSHARD_OP("neg", sum);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return -a;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A, A da) const {
    return -da;
  }
};
struct Abs {
  GSHARD_OP("abs", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return a < A(0) ? A(-a) : a;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A a, A da) const {
    return a > A(0) ? da : (a < A(0) ? A(-da) : A(0));
  }
};
struct Square {
  GSHARD_OP("square", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return a * a;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A a, A da) const {
    return A(2) * a * da;
  }
};
struct Relu {
  GSHARD_OP("relu", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a) const {
    return a > A(0) ? a : A(0);
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A a, A da) const {
    return a > A(0) ? da : A(0);
  }
};
struct Minimum {
  GSHARD_OP("minimum", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return b < a ? b : a;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A a, A b, A da, A db) const {
    return b < a ? db : da;
  }
};
struct Maximum {
  GSHARD_OP("maximum", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A a, A b) const {
    return a < b ? b : a;
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A a, A b, A da, A db) const {
    return a < b ? db : da;
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
  template <class C, class A>
  KOKKOS_INLINE_FUNCTION A jvp(C c, A, A, C, A da, A db) const {
    return c != C(0) ? da : db;
  }
};
template <class U>
struct Cast {
  GSHARD_OP("cast", none);
  template <class A>
  KOKKOS_INLINE_FUNCTION U operator()(A a) const {
    return static_cast<U>(a);
  }
  template <class A>
  KOKKOS_INLINE_FUNCTION U jvp(A, A da) const {
    return static_cast<U>(da);
  }
};
#undef GSHARD_OP

// `body` is f(x); `slope` is f'(x), which the backward pass multiplies by the cotangent.
#define GSHARD_FLOAT_OP(Name, text, body, slope)            \
  struct Name {                                             \
    static constexpr const char* name = text;               \
    static constexpr Linearity linearity = Linearity::none; \
    static constexpr bool floating_only = true;             \
    template <class A>                                      \
    KOKKOS_INLINE_FUNCTION A operator()(A x) const {        \
      return body;                                          \
    }                                                       \
    template <class A>                                      \
    KOKKOS_INLINE_FUNCTION A jvp(A x, A dx) const {         \
      return (slope)*dx;                                    \
    }                                                       \
  }
GSHARD_FLOAT_OP(Exp, "exp", math::exp(x), math::exp(x));
GSHARD_FLOAT_OP(Log, "log", math::log(x), A(1) / x);
GSHARD_FLOAT_OP(Sqrt, "sqrt", math::sqrt(x), A(0.5) / math::sqrt(x));
GSHARD_FLOAT_OP(Rsqrt, "rsqrt", A(1) / math::sqrt(x), A(-0.5) / (x * math::sqrt(x)));
GSHARD_FLOAT_OP(Tanh, "tanh", math::tanh(x), A(1) - math::tanh(x) * math::tanh(x));
GSHARD_FLOAT_OP(Sigmoid, "sigmoid", A(1) / (A(1) + math::exp(-x)),
                math::exp(-x) / ((A(1) + math::exp(-x)) * (A(1) + math::exp(-x))));
// The exact (erf) form, as PyTorch's default gelu; slope Phi(x) + x phi(x).
GSHARD_FLOAT_OP(Gelu, "gelu", A(0.5) * x * (A(1) + math::erf(x * A(0.70710678118654752440))),
                A(0.5) * (A(1) + math::erf(x * A(0.70710678118654752440))) +
                    x * math::exp(A(-0.5) * x * x) * A(0.39894228040143267794));
#undef GSHARD_FLOAT_OP

struct Pow {
  static constexpr const char* name = "pow";
  static constexpr Linearity linearity = Linearity::none;
  static constexpr bool floating_only = true;
  template <class A>
  KOKKOS_INLINE_FUNCTION A operator()(A x, A y) const {
    return math::pow(x, y);
  }
  // The exponent's term only where it has a tangent (log of a negative base otherwise).
  template <class A>
  KOKKOS_INLINE_FUNCTION A jvp(A x, A y, A dx, A dy) const {
    const A base = dx != A(0) ? y * math::pow(x, y - A(1)) * dx : A(0);
    return dy != A(0) ? base + math::pow(x, y) * math::log(x) * dy : base;
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

  std::int64_t step = 0;  // the last dimension's stride (1, or 0 when broadcast)
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t* idx) {
    std::int64_t off = base;
    for (int d = 0; d + 1 < rank; ++d) off += idx[d] * stride[d];
    row_start = data + off;
    step = stride[rank > 0 ? rank - 1 : 0];
  }
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t j) const { return row_start[j * step]; }
  int id = -1;  // which leaf of the chain (for the backward pass's tangents)
  KOKKOS_INLINE_FUNCTION T tangent(std::int64_t, int leaf) const { return T(id == leaf ? 1 : 0); }
};

template <class T>
struct ScalarEval {
  T value{};
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t*) {}
  KOKKOS_INLINE_FUNCTION T operator()(std::int64_t) const { return value; }
  KOKKOS_INLINE_FUNCTION T tangent(std::int64_t, int) const { return T(0); }
};

template <class Op, class... K>
struct MapEval;
template <class Op, class A>
struct MapEval<Op, A> {
  Op op;
  A a;
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t* idx) { a.row(idx); }
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t j) const { return op(a(j)); }
  KOKKOS_INLINE_FUNCTION auto tangent(std::int64_t j, int leaf) const {
    return op.jvp(a(j), a.tangent(j, leaf));
  }
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
  KOKKOS_INLINE_FUNCTION auto tangent(std::int64_t j, int leaf) const {
    return op.jvp(a(j), b(j), a.tangent(j, leaf), b.tangent(j, leaf));
  }
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
  KOKKOS_INLINE_FUNCTION auto tangent(std::int64_t j, int leaf) const {
    return op.jvp(a(j), b(j), c(j), a.tangent(j, leaf), b.tangent(j, leaf), c.tangent(j, leaf));
  }
};

/// The backward pass of a fused chain for one leaf: the cotangent times the chain's derivative
/// with respect to that leaf (forward-mode through the chain, in the same one kernel).
template <class G, class Ev>
struct LeafGradientEval {
  G g;
  Ev ev;
  int leaf = 0;
  KOKKOS_INLINE_FUNCTION void row(const std::int64_t* idx) {
    g.row(idx);
    ev.row(idx);
  }
  KOKKOS_INLINE_FUNCTION auto operator()(std::int64_t j) const {
    return g(j) * ev.tangent(j, leaf);
  }
};

/// The output block of a fused kernel: padded extents, and how much of each is real.
struct FusedBlock {
  int rank = 0;
  std::int64_t extent[max_dims]{};
  std::int64_t valid[max_dims]{};
};

/// The rows of a fused kernel's output block (kernels/rows.hpp): each row evaluates the chain at
/// its valid elements and writes zeros in its padding.
template <class T, class Ev>
struct FusedRows {
  Ev ev;
  T* out;
  FusedBlock g;
  std::int64_t last, last_valid;
  struct State {
    Ev e;
    T* dst;
    std::int64_t n;  // valid elements (0 in a padding row)
  };
  KOKKOS_INLINE_FUNCTION State begin(const std::int64_t row) const {
    std::int64_t idx[max_dims]{};
    bool real = true;
    for (std::int64_t d = g.rank - 2, rest = row; d >= 0; --d) {
      idx[d] = rest % g.extent[d];
      rest /= g.extent[d];
      real = real && idx[d] < g.valid[d];
    }
    State s{ev, out + row * last, real ? last_valid : 0};
    s.e.row(idx);
    return s;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t length(const State&) const { return last; }
  KOKKOS_INLINE_FUNCTION void element(const State& s, const std::int64_t j) const {
    s.dst[j] = j < s.n ? static_cast<T>(s.e(j)) : T(0);
  }
  KOKKOS_INLINE_FUNCTION void walk(const State& s) const {
    for (std::int64_t j = 0; j < s.n; ++j) s.dst[j] = static_cast<T>(s.e(j));
    for (std::int64_t j = s.n; j < last; ++j) s.dst[j] = T(0);
  }
};

/// out = ev over the whole padded block: ONE kernel launch, zeros in the padding.
template <class T, class Ev>
void run_fused(const Ev& ev, T* out, const FusedBlock& g) {
  KernelSpan span("kernel", "fused elementwise");
  const int r = g.rank;
  const std::int64_t last = r > 0 ? g.extent[r - 1] : 1;
  const std::int64_t last_valid = r > 0 ? g.valid[r - 1] : 1;
  std::int64_t rows = 1;
  for (int d = 0; d + 1 < r; ++d) rows *= g.extent[d];
  if (rows * last == 0) return;
  for_each_row("gshard::elementwise", rows, FusedRows<T, Ev>{ev, out, g, last, last_valid});
}

}  // namespace detail
}  // namespace gshard
