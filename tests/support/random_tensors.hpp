#pragma once
// Random layouts and random global tensors for property tests, and this rank's shard of a global
// tensor built with the tests' own block arithmetic (block_reference.hpp), not the library's.
//
// Values are dyadic rationals (k/1024 in [-2, 2] for double, k/4 for float) so that sums of a
// few thousand terms are exact; a partial layout gets random summands over its partial
// coordinates that add up to the global value.
#include <Kokkos_Core.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <gshard/core/layout.hpp>

#include "block_reference.hpp"

namespace gshard::test {

using Int = std::int64_t;
using gshard::Layout;
using gshard::Shape;

// Calls f(local index, global row-major index or -1 for padding) for every element of this
// rank's padded block under `l`, whose global shape is `shape` (in l's order).
template <class F>
inline Int for_block(const Layout& l, const Shape& shape, const Grid& grid, F&& f) {
  const auto r = static_cast<std::size_t>(l.rank);
  std::vector<Block1> b(r);
  std::vector<Int> stride(r);
  Int total = 1;
  Int s = 1;
  for (std::size_t d = r; d-- > 0;) {
    stride[d] = s;
    s *= shape[d];
  }
  for (std::size_t d = 0; d < r; ++d) {
    b[d] = block1(shape[d], l.dims[d].axes.data(), l.dims[d].axis_count, grid);
    total *= b[d].chunk;
  }
  for (Int i = 0; i < total; ++i) {
    Int rest = i;
    Int g = 0;
    bool pad = false;
    for (std::size_t d = r; d-- > 0;) {
      const Int local = rest % b[d].chunk;
      rest /= b[d].chunk;
      if (local >= b[d].valid) pad = true;
      g += (b[d].offset + local) * stride[d];
    }
    f(i, pad ? Int{-1} : g);
  }
  return total;
}

inline std::uint64_t mix(std::uint64_t x) {  // splitmix64 finaliser, our own copy
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A dyadic value in [-range, range] with `bits` fractional bits, from a hash.
inline double dyadic(std::uint64_t h, int range, int bits) {
  const Int scale = Int{1} << bits;
  const Int span = 2 * range * scale + 1;
  return static_cast<double>(static_cast<Int>(h % static_cast<std::uint64_t>(span)) -
                             range * scale) /
         static_cast<double>(scale);
}

// Double cases: k/1024 in [-2, 2]; float cases: k/4 in [-2, 2]. Summands of partial copies are
// within [-1, 1]. With at most a few thousand terms per output element, every partial sum is
// exact in the element type.
inline int value_bits(bool single) { return single ? 2 : 10; }

inline std::vector<double> random_global(Int n, std::uint64_t salt, int which, bool single) {
  std::vector<double> g(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < g.size(); ++i)
    g[i] = dyadic(mix(salt * 1000003ULL + static_cast<std::uint64_t>(which) * 7919ULL + i * 31ULL),
                  2, value_bits(single));
  return g;
}

// The share of partial copy q (of `copies`) of global element g: random for q > 0, the rest at 0.
inline double summand(double value, Int g, int q, int copies, std::uint64_t salt, bool single) {
  if (copies == 1) return value;
  auto part = [&](int j) {
    return dyadic(
        mix(salt ^ mix(static_cast<std::uint64_t>(g) * 64 + static_cast<std::uint64_t>(j))), 1,
        value_bits(single));
  };
  if (q != 0) return part(q);
  double rest = value;
  for (int j = 1; j < copies; ++j) rest -= part(j);
  return rest;
}

inline int find_label(const Layout& l, char label) {
  for (int d = 0; d < l.rank; ++d)
    if (l.dims[d].label == label) return d;
  return -1;
}

// This rank's padded shard of `global` (row-major in l's order, shape in l's order); a partial
// layout gets this rank's random summand.
template <class T>
std::vector<T> shard_of(const Layout& l, const Shape& shape, const std::vector<double>& global,
                        const Grid& grid, std::uint64_t salt, bool single) {
  int copies = 1;
  int q = 0;
  for (int i = 0; i < l.partial_count; ++i) {
    const auto a = static_cast<std::size_t>(l.partial[i]);
    copies *= grid.sizes[a];
    q = q * grid.sizes[a] + grid.coords[a];
  }
  std::vector<T> out;
  for_block(l, shape, grid, [&](Int i, Int g) {
    if (static_cast<Int>(out.size()) <= i) out.resize(static_cast<std::size_t>(i) + 1, T{});
    if (g >= 0)
      out[static_cast<std::size_t>(i)] =
          static_cast<T>(summand(global[static_cast<std::size_t>(g)], g, q, copies, salt, single));
  });
  return out;
}

template <class T>
Kokkos::View<T*> device_copy(const std::vector<T>& v) {
  Kokkos::View<T*> view("einsum test operand", v.size());
  auto mirror = Kokkos::create_mirror_view(view);
  for (std::size_t i = 0; i < v.size(); ++i) mirror(i) = v[i];
  Kokkos::deep_copy(view, mirror);
  return view;
}

template <class T>
std::vector<T> host_copy(const Kokkos::View<T*>& view) {
  auto mirror = Kokkos::create_mirror_view(view);
  Kokkos::deep_copy(mirror, view);
  return std::vector<T>(mirror.data(), mirror.data() + mirror.extent(0));
}

// An axis by name (or by number when out of range, so a broken layout still prints).
inline std::string axis_text(int a, const std::vector<std::string>& names) {
  if (a >= 0 && a < static_cast<int>(names.size())) return names[static_cast<std::size_t>(a)];
  std::string s = "#";
  s += std::to_string(a);
  return s;
}

inline std::string layout_text(const Layout& l, const std::vector<std::string>& names) {
  std::string s;
  for (int d = 0; d < l.rank; ++d) {
    if (d > 0) s += ' ';
    s += l.dims[d].label;
    for (int i = 0; i < l.dims[d].axis_count; ++i) {
      s += i == 0 ? ':' : '*';
      s += axis_text(l.dims[d].axes[static_cast<std::size_t>(i)], names);
    }
  }
  for (int i = 0; i < l.partial_count; ++i) {
    if (!s.empty()) s += ' ';
    s += '+';
    s += axis_text(l.partial[static_cast<std::size_t>(i)], names);
  }
  return s;
}

class Dice {
 public:
  explicit Dice(std::uint64_t seed) : engine_(seed) {}
  int below(int n) { return static_cast<int>(engine_() % static_cast<std::uint64_t>(n)); }
  int between(int lo, int hi) { return lo + below(hi - lo + 1); }
  bool chance(int percent) { return below(100) < percent; }
  template <class V>
  void shuffle(V& v) {
    for (std::size_t i = v.size(); i > 1; --i)
      std::swap(v[i - 1], v[static_cast<std::size_t>(below(static_cast<int>(i)))]);
  }
  template <class V>
  auto pick(const V& v) {
    return v[static_cast<std::size_t>(below(static_cast<int>(v.size())))];
  }

 private:
  std::mt19937_64 engine_;  // same sequence on every platform and rank
};

// A layout over `labels` (memory order): every mesh axis, in random order, splits a random
// dimension (major to minor in the order drawn) or none; `fixed` gives some labels their axes
// up front. Unused axes become partial with some chance.
inline Layout random_layout(Dice& dice, const std::string& labels, int axis_count,
                            const std::map<char, std::vector<int>>& fixed) {
  const auto r = labels.size();
  std::vector<std::vector<int>> axes(r);
  std::vector<bool> used(static_cast<std::size_t>(axis_count), false);
  std::vector<bool> locked(r, false);
  for (std::size_t d = 0; d < r; ++d) {
    const auto it = fixed.find(labels[d]);
    if (it == fixed.end()) continue;
    axes[d] = it->second;
    locked[d] = true;
    for (int a : it->second) used[static_cast<std::size_t>(a)] = true;
  }
  std::vector<int> order;
  for (int a = 0; a < axis_count; ++a)
    if (!used[static_cast<std::size_t>(a)]) order.push_back(a);
  dice.shuffle(order);
  std::vector<int> unused;
  for (int a : order) {
    std::vector<std::size_t> open;
    for (std::size_t d = 0; d < r; ++d)
      if (!locked[d]) open.push_back(d);
    const int where = dice.below(static_cast<int>(open.size()) + 1);  // open.size(): none
    if (where < static_cast<int>(open.size()))
      axes[open[static_cast<std::size_t>(where)]].push_back(a);
    else
      unused.push_back(a);
  }
  Layout l;
  l.rank = static_cast<int>(r);
  for (std::size_t d = 0; d < r; ++d) {
    l.dims[d].label = labels[d];
    for (int a : axes[d]) l.dims[d].axes[static_cast<std::size_t>(l.dims[d].axis_count++)] = a;
  }
  for (int a : unused)
    if (dice.chance(35)) l.partial[static_cast<std::size_t>(l.partial_count++)] = a;
  return l;
}

}  // namespace gshard::test
