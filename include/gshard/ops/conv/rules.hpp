#pragma once
// Convolution and pooling specs ("H:K W:L C->O", "HW"), their options, the partition rule
// (infer_conv, infer_pool) and the compile-time checks of the typed API (ops/conv.hpp).
#include <array>
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "../../spmd/plan.hpp"
#include "../../tensor/sharded.hpp"

namespace gshard {

/// valid: no padding, out = floor((N - dilation*(K-1) - 1) / stride) + 1.
/// same: zeros around the input so that out = N (stride 1 only); dilation*(K-1) zeros in all,
/// the smaller half before (PyTorch's padding="same").
enum class Padding { valid, same };

/// Per spatial label, in the spec's order.
struct ConvOptions {
  Padding padding = Padding::valid;
  std::array<int, 3> stride{1, 1, 1};
  std::array<int, 3> dilation{1, 1, 1};
};

/// Pooling windows per spatial label (no padding); stride 0 means the window.
struct PoolOptions {
  std::array<int, 3> window{1, 1, 1};
  std::array<int, 3> stride{0, 0, 0};
};

namespace conv_error {
template <class>
inline constexpr bool always_false = false;
template <auto Piece, auto Spec>
struct malformed_conv_spec {
  static_assert(always_false<malformed_conv_spec>,
                "gshard::conv: write \"H:K W:L C->O\" (input spatial label:kernel label, then "
                "input channel->output channel) or, for pooling, \"HW\"");
};
template <auto Label, auto Spec>
struct label_repeated_in_conv_spec {
  static_assert(always_false<label_repeated_in_conv_spec>,
                "gshard::conv: a label appears twice in the spec");
};
template <auto Label, auto InputSpec>
struct label_not_in_input {
  static_assert(always_false<label_not_in_input>,
                "gshard::conv/pool: a spatial or input-channel label is not a label of the input");
};
template <auto Label, auto InputSpec>
struct output_channel_label_in_input {
  static_assert(always_false<output_channel_label_in_input>,
                "gshard::conv: the output channel label must be new to the input");
};
template <auto Conv, auto WeightSpec>
struct weight_labels_differ_from_conv_spec {
  static_assert(always_false<weight_labels_differ_from_conv_spec>,
                "gshard::conv: the weights' labels must be the output channel, the input channel "
                "and one kernel label per spatial label, in any order");
};
template <auto Spec, int Expected>
struct wrong_spatial_label_count {
  static_assert(always_false<wrong_spatial_label_count>,
                "gshard::conv1d needs one \"X:K\" pair, conv2d two");
};
}  // namespace conv_error

/// A parsed conv or pooling spec. Pooling specs have no channels (in_channel == 0).
struct ConvSpec {
  int spatial_count = 0;
  std::array<char, 3> spatial{};  // input labels that slide
  std::array<char, 3> kernel{};   // the weights' matching kernel labels
  char in_channel = 0;            // contracted
  char out_channel = 0;           // the weights' label that replaces in_channel in the output
};

enum class ConvSpecError { none, malformed, label_repeated };

struct ConvParse {
  ConvSpec spec{};
  ConvSpecError error = ConvSpecError::none;
  std::string_view offending{};
};

namespace detail {

constexpr bool conv_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

constexpr ConvParse conv_repeats(ConvParse p, std::string_view text) {
  std::array<char, 8> seen{};
  int n = 0;
  auto add = [&](char c) {
    for (int i = 0; i < n; ++i)
      if (seen[static_cast<std::size_t>(i)] == c) return false;
    seen[static_cast<std::size_t>(n++)] = c;
    return true;
  };
  for (int i = 0; i < p.spec.spatial_count; ++i) {
    const auto s = static_cast<std::size_t>(i);
    for (char c : {p.spec.spatial[s], p.spec.kernel[s]})
      if (c != 0 && !add(c)) {
        p.error = ConvSpecError::label_repeated;
        p.offending = text.substr(text.find(c), 1);
        return p;
      }
  }
  for (char c : {p.spec.in_channel, p.spec.out_channel})
    if (c != 0 && !add(c)) {
      p.error = ConvSpecError::label_repeated;
      p.offending = text.substr(text.find(c), 1);
      return p;
    }
  return p;
}

/// "H:K W:L C->O": 1 to 3 pairs (input spatial label : weights' kernel label), then the input
/// channel and the output channel.
constexpr ConvParse parse_conv(std::string_view text) {
  ConvParse p;
  std::size_t i = 0;
  auto fail = [&](std::string_view piece) {
    p.error = ConvSpecError::malformed;
    p.offending = piece.empty() ? text : piece;
    return p;
  };
  for (;;) {
    while (i < text.size() && text[i] == ' ') ++i;
    std::size_t e = i;
    while (e < text.size() && text[e] != ' ') ++e;
    const std::string_view tok = text.substr(i, e - i);
    if (tok.empty()) return fail(text);
    i = e;
    if (tok.size() == 3 && tok[1] == ':' && conv_letter(tok[0]) && conv_letter(tok[2])) {
      if (p.spec.spatial_count == 3) return fail(tok);
      const auto s = static_cast<std::size_t>(p.spec.spatial_count++);
      p.spec.spatial[s] = tok[0];
      p.spec.kernel[s] = tok[2];
      continue;
    }
    if (tok.size() == 4 && tok[1] == '-' && tok[2] == '>' && conv_letter(tok[0]) &&
        conv_letter(tok[3]) && p.spec.spatial_count > 0) {
      while (i < text.size() && text[i] == ' ') ++i;
      if (i != text.size()) return fail(text.substr(i));
      p.spec.in_channel = tok[0];
      p.spec.out_channel = tok[3];
      return conv_repeats(p, text);
    }
    return fail(tok);
  }
}

/// "HW": the spatial labels of a pooling, 1 to 3.
constexpr ConvParse parse_pool(std::string_view text) {
  ConvParse p;
  if (text.empty() || text.size() > 3) {
    p.error = ConvSpecError::malformed;
    p.offending = text;
    return p;
  }
  for (char c : text) {
    if (!conv_letter(c)) {
      p.error = ConvSpecError::malformed;
      p.offending = text;
      return p;
    }
    p.spec.spatial[static_cast<std::size_t>(p.spec.spatial_count++)] = c;
  }
  return conv_repeats(p, text);
}

}  // namespace detail

/// The layouts a convolution brings its operands to, and its result's layout.
struct ConvLayouts {
  Layout input;
  Layout weights;
  Layout output;
};

/// The partition rule (labels assumed checked):
/// 1. The input keeps its layout: spatial and other (batch) labels keep their axes, and so do
///    its pending partial sums (convolution is linear in the input).
/// 2. The input channel C takes the input's axes; when the input does not split C, the
///    weights' axes for C if the input uses none of them (the input is sliced locally).
///    The result is a partial sum over C's axes.
/// 3. The output channel O (at C's position in the input's label order) takes the weights'
///    axes for O when the input uses none of them (nor C), else it is replicated.
/// 4. The weights are brought to: O and C as above, kernel labels whole, no pending sums.
constexpr ConvLayouts infer_conv(const ConvSpec& s, const Layout& x, const Layout& w) {
  ConvLayouts r{x, w, x};
  const int xc = x.find(s.in_channel);
  const int wc = w.find(s.in_channel);
  const int wo = w.find(s.out_channel);
  unsigned used = detail::partial_mask(x);
  for (int d = 0; d < x.rank; ++d)
    if (d != xc) used |= detail::axes_of(x.dims[d]);
  DimLayout c = x.dims[xc];
  if (!c.split() && (detail::axes_of(w.dims[wc]) & used) == 0) {
    c.axis_count = w.dims[wc].axis_count;
    c.axes = w.dims[wc].axes;
  }
  r.input.dims[xc] = c;
  used |= detail::axes_of(c);
  DimLayout o{s.out_channel, 0, {}};
  if ((detail::axes_of(w.dims[wo]) & used) == 0) {
    o.axis_count = w.dims[wo].axis_count;
    o.axes = w.dims[wo].axes;
  }
  r.weights.partial_count = 0;
  for (int d = 0; d < w.rank; ++d) {
    const char l = w.dims[d].label;
    r.weights.dims[d] = l == s.in_channel    ? DimLayout{l, c.axis_count, c.axes}
                        : l == s.out_channel ? o
                                             : DimLayout{l, 0, {}};
  }
  r.output.dims[xc] = o;
  for (int i = 0; i < c.axis_count; ++i)
    r.output.partial[static_cast<std::size_t>(r.output.partial_count++)] =
        c.axes[static_cast<std::size_t>(i)];
  return r;
}

/// Pooling keeps the input's layout; max pooling finishes pending partial sums first (it is not
/// linear), average pooling keeps them pending.
constexpr Layout infer_pool(const Layout& x, bool is_max) {
  Layout r = x;
  if (is_max) r.partial_count = 0;
  return r;
}

namespace detail {

template <fixed_string Spec, bool Pool>
constexpr bool conv_spec_ok() {
  constexpr ConvParse p = Pool ? parse_pool(Spec.view()) : parse_conv(Spec.view());
  if constexpr (p.error == ConvSpecError::none) {
    return true;
  } else {
    constexpr auto what = make_fixed<p.offending.size()>(p.offending);
    if constexpr (p.error == ConvSpecError::malformed)
      return sizeof(conv_error::malformed_conv_spec<detail::shown<what>, detail::shown<Spec>>) == 0;
    else
      return sizeof(conv_error::label_repeated_in_conv_spec<detail::shown<what>,
                                                            detail::shown<Spec>>) == 0;
  }
}

template <char Label>
constexpr fixed_string conv_label_fixed() {
  fixed_string f;
  f.data[0] = Label;
  return f;
}

template <char Label, class X>
constexpr bool conv_in_input() {
  if constexpr (X::layout.find(Label) >= 0) {
    return true;
  } else {
    return sizeof(conv_error::label_not_in_input<detail::shown<conv_label_fixed<Label>()>,
                                                 detail::shown<X::spec>>) == 0;
  }
}

template <fixed_string Spec, class X, int... I>
constexpr bool conv_spatial_in_input(std::integer_sequence<int, I...>) {
  constexpr ConvSpec s = parse_conv(Spec.view()).spec;
  return (conv_in_input<s.spatial[static_cast<std::size_t>(I)], X>() && ...);
}

constexpr bool conv_weights_match(const ConvSpec& s, const Layout& w) {
  if (w.rank != s.spatial_count + 2) return false;
  if (w.find(s.in_channel) < 0 || w.find(s.out_channel) < 0) return false;
  for (int i = 0; i < s.spatial_count; ++i)
    if (w.find(s.kernel[static_cast<std::size_t>(i)]) < 0) return false;
  return true;
}

template <fixed_string Spec, class X, class W>
constexpr bool conv_operands_ok() {
  constexpr ConvSpec s = parse_conv(Spec.view()).spec;
  constexpr bool weights_match = conv_weights_match(s, W::layout);
  if constexpr (!conv_in_input<s.in_channel, X>()) {
    return false;
  } else if constexpr (!conv_spatial_in_input<Spec, X>(
                           std::make_integer_sequence<int, s.spatial_count>{})) {
    return false;
  } else if constexpr (X::layout.find(s.out_channel) >= 0) {
    return sizeof(conv_error::output_channel_label_in_input<
                  detail::shown<conv_label_fixed<s.out_channel>()>, detail::shown<X::spec>>) == 0;
  } else if constexpr (!weights_match) {
    return sizeof(conv_error::weight_labels_differ_from_conv_spec<detail::shown<Spec>,
                                                                  detail::shown<W::spec>>) == 0;
  } else {
    return true;
  }
}

template <fixed_string Spec, int Count>
constexpr bool conv_count_ok() {
  if constexpr (Count == 0 || parse_conv(Spec.view()).spec.spatial_count == Count)
    return true;
  else
    return sizeof(
               conv_error::wrong_spatial_label_count<detail::shown<Spec>, detail::shown<Count>>) ==
           0;
}

template <fixed_string Spec, class X, int... I>
constexpr bool pool_labels_in_input(std::integer_sequence<int, I...>) {
  constexpr ConvSpec s = parse_pool(Spec.view()).spec;
  return (conv_in_input<s.spatial[static_cast<std::size_t>(I)], X>() && ...);
}

}  // namespace detail
}  // namespace gshard
