#pragma once
// The Mixture-of-Experts layer of GShard (Lepikhin et al. 2020, Algorithms 1 and 2), written with
// the library's ops so that it is partitioned, differentiated and checked like any user code.
//
//   x "G S M" (groups split over any axes)  --router-->  gates "G S E" (softmax of x wg)
//   routing per group (a local kernel): the k choices, positions in each expert's capacity C
//     (first choices before second choices), drops, the token of every (expert, slot)
//   dispatch: take_along<"S">(x, token "G E C") -> "G E C M"      (index-based, local)
//   reshard to "E G C M" with E split like the experts' weights   (one AllToAll)
//   expert FFN: relu(d wi) wo, a batched GEMM over the local experts
//   reshard back to the groups' layout                              (the reverse AllToAll)
//   combine: take_along<"F">(y, slot "G S K") weighted by the gates  (index-based, local)
//
// Options.dense switches dispatch and combine to GShard's dense GSEC einsums (for checking).
#include <algorithm>
#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../ops/einsum.hpp"
#include "../ops/elementwise.hpp"
#include "../ops/index.hpp"
#include "../ops/normalize.hpp"
#include "../ops/random.hpp"
#include "../ops/reduce.hpp"
#include "../ops/shape.hpp"
#include "../ops/topk.hpp"
#include "../spmd/reshard.hpp"
#include "../tensor/creation.hpp"
#include "../tensor/graph.hpp"
#include "../tensor/sharded.hpp"
#include "diagnostics.hpp"
#include "moe_dropless.hpp"

namespace gshard::nn {

/// What happens to the second expert of top-2 gating (GShard §2.2 and Lingvo's policies).
enum class SecondExpert {
  all,       // always dispatched
  random,    // kept only if 2 * g2 > u, u ~ U(0, 1): small second gates are mostly dropped
  sampling,  // the second expert is sampled from the gates with the first masked out
};

struct MoeOptions {
  int k = 2;                     // experts per token: 1 (Switch), 2 (GShard), or more
  double capacity_factor = 2.0;  // C = max(min_capacity, floor(S * capacity_factor / E))
  std::int64_t min_capacity = 4;
  SecondExpert second_expert = SecondExpert::random;  // k = 2 only
  double jitter = 0.0;     // router input times U(1 - jitter, 1 + jitter) (training)
  std::uint64_t seed = 0;  // routing randomness (policies, jitter): vary it per step
  bool dense = false;      // GShard's dense dispatch/combine einsums (for checking)
  // No capacity: every routed assignment is computed, exchanged by exact counts and multiplied by
  // one GEMM per expert over exactly its rows (moe_dropless.hpp). capacity_factor is ignored.
  bool dropless = false;
  // Dropless: the most rows one rank's experts may receive (0: no limit). Over it, every rank
  // throws; the worst case is all of the exchange group's assignments to one expert.
  std::int64_t dropless_max_rows = 0;
  // Dropless: exchange rows as Tutel's 2DH (within the node, then one larger message per node)
  // when E's exchange spans two or more mesh axes, the first of them the nodes.
  bool hierarchical = false;
  // DeepSeek-V3's balancing without a loss term: a per-expert bias added to the gates when
  // choosing experts (not to the weights the outputs are mixed with). Empty: none; else E
  // values, the same on every rank, nudged between steps by balance_selection_bias().
  std::vector<double> selection_bias{};
};

/// The layer's result: the output in x's layout, the auxiliary load-balancing loss
/// mean_e(m_e c_e) E^2 averaged over groups (1 for a balanced router), the router z-loss
/// (mean over tokens of logsumexp(logits)^2; add it with a small coefficient), and statistics.
template <class Out, class Scalar>
struct MoeResult {
  Out output;
  Scalar aux_loss;
  Scalar z_loss;
  std::vector<std::int64_t> tokens_per_expert;  // kept (token, choice) assignments, all groups
  double dropped_fraction = 0;  // of the assignments routed (after the second-expert policy)
  std::int64_t capacity = 0;
};

/// C for S tokens per group and E experts.
inline std::int64_t moe_capacity(std::int64_t s, std::int64_t e, const MoeOptions& o) {
  const auto c = static_cast<std::int64_t>(static_cast<double>(s) * o.capacity_factor /
                                           static_cast<double>(e));
  return std::max(o.min_capacity, c);
}

/// DeepSeek-V3's auxiliary-loss-free balancing: after a step, each expert's selection bias moves
/// by `rate` toward balance, up if it took fewer than the mean assignments, down if more.
/// `tokens_per_expert` is a step's MoeResult::tokens_per_expert (global counts, the same on every
/// rank, so every rank's bias stays the same). An empty bias starts at zeros.
inline void balance_selection_bias(std::vector<double>& bias,
                                   const std::vector<std::int64_t>& tokens_per_expert,
                                   double rate) {
  const std::size_t e = tokens_per_expert.size();
  if (bias.empty()) bias.assign(e, 0.0);
  if (bias.size() != e)
    throw Error("balance_selection_bias", std::to_string(bias.size()) + " biases for " +
                                              std::to_string(e) + " experts' counts");
  double mean = 0;
  for (std::int64_t n : tokens_per_expert) mean += static_cast<double>(n);
  mean /= static_cast<double>(std::max<std::size_t>(e, 1));
  for (std::size_t i = 0; i < e; ++i) {
    const auto n = static_cast<double>(tokens_per_expert[i]);
    bias[i] += n < mean ? rate : n > mean ? -rate : 0.0;
  }
}

namespace detail {

using gshard::DimLayout;
using gshard::detail::RuntimeTensor;

/// The layout with dimensions `labels`: `label` split as in `from` (no partials), the others whole.
constexpr Layout split_like(const Layout& from, char label, std::string_view labels) {
  Layout l{};
  l.rank = static_cast<int>(labels.size());
  for (int d = 0; d < l.rank; ++d) {
    l.dims[d].label = labels[static_cast<std::size_t>(d)];
    if (l.dims[d].label == label) l.dims[d] = from.dims[from.find(label)];
  }
  return l;
}

/// "E G C <last>": E split like the experts' weights, G over x's G axes that E does not use.
constexpr Layout expert_layout(const Layout& x, const Layout& w, char last) {
  Layout l{};
  l.rank = 4;
  l.dims[0] = w.dims[w.find('E')];
  const DimLayout& g = x.dims[x.find('G')];
  l.dims[1].label = 'G';
  for (int i = 0; i < g.axis_count; ++i)
    if (!l.dims[0].uses(g.axes[i])) l.dims[1].axes[l.dims[1].axis_count++] = g.axes[i];
  l.dims[2].label = 'C';
  l.dims[3].label = last;
  return l;
}

template <class T, class MeshT, Layout L>
using SpecTensor = Sharded<T, MeshT, gshard::detail::spec_of<MeshT, L>()>;

constexpr bool has_labels(const Layout& l, std::string_view labels) {
  if (l.rank != static_cast<int>(labels.size())) return false;
  for (char c : labels)
    if (l.find(c) < 0) return false;
  return true;
}

/// The routing of one group block (local: G is the only split label of every operand).
template <class T>
struct Routing {
  Kokkos::View<std::int64_t*> choice;  // "G S K": the expert of each choice
  Kokkos::View<std::int64_t*> slot;    // "G S K": e * C + position if kept, else -1
  Kokkos::View<std::int64_t*> token;   // "G E C": the token in each slot, or -1
  Kokkos::View<T*> keep;               // "G S K": 1 if kept, else 0
  Kokkos::View<T*> first;              // "G E": the fraction of tokens whose first choice is e
  Kokkos::View<T*> kept;               // "G E": kept assignments per expert
  Kokkos::View<T*> routed;             // "G E": assignments after the second-expert policy
};

/// Choices, positions and drops for each local group, one group per thread. `gates` is the
/// local block of "G S E", `u` of "G S K" uniforms (policies), `valid_g` the groups held.
template <class T>
Routing<T> route(const Kokkos::View<T*>& gates, const Kokkos::View<T*>& u, std::int64_t g_local,
                 std::int64_t valid_g, std::int64_t s, std::int64_t e, std::int64_t k,
                 std::int64_t c, SecondExpert policy, bool tokens = true,
                 const Kokkos::View<T*>& bias = {}) {
  Routing<T> r;
  const auto n = static_cast<std::size_t>(g_local);
  const auto sk = static_cast<std::size_t>(s * k);
  r.choice = Kokkos::View<std::int64_t*>("gshard::moe_choice", n * sk);
  r.slot = Kokkos::View<std::int64_t*>("gshard::moe_slot", n * sk);
  r.token = Kokkos::View<std::int64_t*>("gshard::moe_token",
                                        tokens ? n * static_cast<std::size_t>(e * c) : 0);
  r.keep = Kokkos::View<T*>("gshard::moe_keep", n * sk);
  r.first = Kokkos::View<T*>("gshard::moe_first", n * static_cast<std::size_t>(e));
  r.kept = Kokkos::View<T*>("gshard::moe_kept", n * static_cast<std::size_t>(e));
  r.routed = Kokkos::View<T*>("gshard::moe_routed", n * static_cast<std::size_t>(e));
  // Per-group scratch: counts per expert (base: kept by earlier choices, cnt: this choice).
  Kokkos::View<std::int64_t*> base("gshard::moe_base", n * static_cast<std::size_t>(e));
  Kokkos::View<std::int64_t*> cnt("gshard::moe_count", n * static_cast<std::size_t>(e));
  Kokkos::View<unsigned char*> routed_flag("gshard::moe_routed_flag", n * sk);
  std::int64_t* choice = r.choice.data();
  std::int64_t* slot = r.slot.data();
  std::int64_t* token = r.token.data();
  T* keep = r.keep.data();
  T* first = r.first.data();
  T* kept = r.kept.data();
  T* routed = r.routed.data();
  const T* gp_all = gates.data();
  const T* up = u.data();
  std::int64_t* base_all = base.data();
  std::int64_t* cnt_all = cnt.data();
  unsigned char* flag_all = routed_flag.data();
  const bool biased = bias.extent(0) > 0;
  const T* bp = bias.data();
  Kokkos::parallel_for(
      "gshard::moe_route", Kokkos::RangePolicy<>(0, valid_g), KOKKOS_LAMBDA(std::int64_t grp) {
        const T* gp = gp_all + grp * s * e;
        std::int64_t* ch = choice + grp * s * k;
        unsigned char* rf = flag_all + grp * s * k;
        const T* ug = up + grp * s * k;
        for (std::int64_t t = 0; t < s; ++t) {
          const T* row = gp + t * e;
          for (std::int64_t j = 0; j < k; ++j) {
            std::int64_t best = -1;
            if (j == 1 && k == 2 && policy == SecondExpert::sampling) {
              // Inverse CDF over the gates without the first choice.
              T total = 0;
              for (std::int64_t x = 0; x < e; ++x)
                if (x != ch[t * k]) total += row[x];
              const T target = ug[t * k + 1] * total;
              T acc = 0;
              for (std::int64_t x = 0; x < e && best < 0; ++x) {
                if (x == ch[t * k]) continue;
                acc += row[x];
                if (acc > target) best = x;
              }
              for (std::int64_t x = e - 1; x >= 0 && best < 0; --x)
                if (x != ch[t * k]) best = x;  // rounding left the target past the end
            } else {
              // The largest remaining gate (plus the selection bias), ties to the smaller expert.
              for (std::int64_t x = 0; x < e; ++x) {
                bool taken = false;
                for (std::int64_t i = 0; i < j; ++i) taken = taken || ch[t * k + i] == x;
                const T score = biased ? row[x] + bp[x] : row[x];
                if (!taken && (best < 0 || score > (biased ? row[best] + bp[best] : row[best])))
                  best = x;
              }
            }
            ch[t * k + j] = best;
            bool on = true;
            if (j == 1 && k == 2 && policy == SecondExpert::random) {
              const T g1 = row[ch[t * k]], g2 = row[best];
              const T norm = g1 + g2 > T(0) ? g2 / (g1 + g2) : T(0);
              on = T(2) * norm > ug[t * k + 1];
            }
            rf[t * k + j] = on ? 1 : 0;
          }
          first[grp * e + ch[t * k]] += T(1) / static_cast<T>(s);
        }
        // Positions: choice j's tokens queue after everything earlier choices kept.
        std::int64_t* b = base_all + grp * e;
        std::int64_t* cn = cnt_all + grp * e;
        if (tokens)
          for (std::int64_t x = 0; x < e * c; ++x) token[grp * e * c + x] = -1;
        for (std::int64_t j = 0; j < k; ++j) {
          for (std::int64_t x = 0; x < e; ++x) cn[x] = 0;
          for (std::int64_t t = 0; t < s; ++t) {
            const std::int64_t at = (grp * s + t) * k + j;
            slot[at] = -1;
            if (!rf[t * k + j]) continue;
            const std::int64_t x = ch[t * k + j];
            const std::int64_t pos = b[x] + cn[x]++;
            routed[grp * e + x] += T(1);
            if (pos >= c) continue;
            slot[at] = x * c + pos;
            keep[at] = T(1);
            kept[grp * e + x] += T(1);
            if (tokens) token[(grp * e + x) * c + pos] = t;
          }
          for (std::int64_t x = 0; x < e; ++x) b[x] = b[x] + cn[x] < c ? b[x] + cn[x] : c;
        }
      });
  return r;
}

}  // namespace detail

namespace detail {

// Compile-time checks of the layer's operands, named in the user's terms.
template <class X, class Wg>
constexpr void check_route_operands() {
  using gshard::detail::shown;
  if constexpr (!(has_labels(X::layout, "GSM") && X::layout.find('S') == 1 &&
                  X::layout.find('G') == 0)) {
    static_assert(sizeof(nn_error::moe_operand_labels<shown<fixed_string("x")>, shown<X::spec>,
                                                      shown<fixed_string("G S M")>>) == 0);
  } else if constexpr (!has_labels(Wg::layout, "ME")) {
    static_assert(sizeof(nn_error::moe_operand_labels<shown<fixed_string("wg")>, shown<Wg::spec>,
                                                      shown<fixed_string("M E")>>) == 0);
  } else if constexpr (X::layout.dims[1].axis_count != 0) {
    static_assert(sizeof(nn_error::moe_tokens_split_along_S<shown<X::spec>>) == 0);
  } else if constexpr (X::layout.partial_count != 0) {
    static_assert(sizeof(nn_error::moe_tokens_hold_partial_sums<shown<X::spec>>) == 0);
  }
}

template <class Wi, class Wo>
constexpr void check_expert_operands() {
  using gshard::detail::shown;
  if constexpr (!(has_labels(Wi::layout, "EMH") && Wi::layout.find('E') == 0)) {
    static_assert(sizeof(nn_error::moe_operand_labels<shown<fixed_string("wi")>, shown<Wi::spec>,
                                                      shown<fixed_string("E M H")>>) == 0);
  } else if constexpr (!(has_labels(Wo::layout, "EHM") && Wo::layout.find('E') == 0)) {
    static_assert(sizeof(nn_error::moe_operand_labels<shown<fixed_string("wo")>, shown<Wo::spec>,
                                                      shown<fixed_string("E H M")>>) == 0);
  }
}

/// The router's decisions for tokens X "G S M": moe() in stages (moe_route, moe_experts,
/// moe_losses), so that a program may compile the stages in different translation units
/// (TransformerLM's moe_router and moe_experts).
template <class X>
struct MoeRouting {
  using T = typename X::value_type;
  using MeshT = typename X::mesh_type;
  static constexpr Layout gse = split_like(X::layout, 'G', "GSE");
  static constexpr Layout gsk = split_like(X::layout, 'G', "GSK");
  static constexpr Layout gec = split_like(X::layout, 'G', "GEC");
  static constexpr Layout ge = split_like(X::layout, 'G', "GE");
  using Gates = SpecTensor<T, MeshT, gse>;
  using PerChoice = SpecTensor<T, MeshT, gsk>;
  using ChoiceIndex = SpecTensor<std::int64_t, MeshT, gsk>;
  using SlotToken = SpecTensor<std::int64_t, MeshT, gec>;
  using PerExpert = SpecTensor<T, MeshT, ge>;

  Gates logits;
  Gates gates;
  ChoiceIndex slot;  // "G S K": e * C + position if kept, else -1 (dropless: C = S)
  SlotToken token;   // "G E C": the token in each slot, or -1 (dropless: C = 0, unused)
  PerChoice weight;  // "G S K": the gate of each kept choice, normalized over the k choices
  PerExpert first;   // "G E": the fraction of tokens whose first choice is e
  std::int64_t experts = 0;
  std::int64_t capacity = 0;                    // 0: dropless
  std::vector<std::int64_t> tokens_per_expert;  // kept assignments, all groups
  double dropped_fraction = 0;
};

/// Router, routing decisions and the statistics of moe() (collective).
template <class X, class Wg>
MoeRouting<X> moe_route(const X& x, const Wg& wg, const MoeOptions& opt) {
  check_route_operands<X, Wg>();
  using R = MoeRouting<X>;
  using T = typename R::T;
  using Gates = typename R::Gates;
  using PerChoice = typename R::PerChoice;
  using ChoiceIndex = typename R::ChoiceIndex;
  using PerExpert = typename R::PerExpert;
  const auto& mesh = x.mesh();
  const Shape xs = x.shape();
  const std::int64_t g = xs[0], s = xs[1];
  const std::int64_t e = wg.shape()[static_cast<std::size_t>(Wg::layout.find('E'))];
  if (opt.k < 1 || opt.k > e)
    throw Error("moe", "k = " + std::to_string(opt.k) + " experts per token, but there are " +
                           std::to_string(e) + " experts (\"" + std::string(Wg::spec.view()) +
                           "\" of global shape " + gshard::detail::shape_string(wg.shape()) + ")");
  if (!opt.dropless && (!(opt.capacity_factor > 0) || opt.min_capacity < 1))
    throw Error("moe", "the capacity factor (" + std::to_string(opt.capacity_factor) +
                           ") and the minimum capacity (" + std::to_string(opt.min_capacity) +
                           ") must be positive");
  if (!(opt.jitter >= 0 && opt.jitter < 1))
    throw Error("moe", "the jitter " + std::to_string(opt.jitter) + " must be in [0, 1)");
  const std::int64_t k = opt.k;
  if (opt.dropless && opt.dense)
    throw Error("moe", "dropless routing has no dense (GSEC einsum) form; set one of them");
  if (opt.dropless_max_rows < 0)
    throw Error("moe", "dropless_max_rows " + std::to_string(opt.dropless_max_rows) +
                           " must be >= 0 (0: no limit)");
  // Dropless: positions up to S (a token takes an expert at most once), so nothing overflows.
  const std::int64_t c = opt.dropless ? s : moe_capacity(s, e, opt);

  const Gates logits = [&] {
    if (opt.jitter > 0) {
      const X noise =
          random_uniform_like(x, opt.seed ^ 0x6a09e667f3bcc908ULL, static_cast<T>(1 - opt.jitter),
                              static_cast<T>(1 + opt.jitter));
      return Gates(einsum<"GSM,ME->GSE">(x * noise, wg));
    }
    return Gates(einsum<"GSM,ME->GSE">(x, wg));
  }();
  const Gates gates = softmax<"E">(logits);

  // Routing: integer decisions, no gradient.
  const PerChoice u = random_uniform<PerChoice>(mesh, {g, s, k}, opt.seed);
  const std::int64_t g_local = gates.local_shape()[0];
  const std::int64_t valid_g = gates.valid_extents()[0];
  if (!opt.selection_bias.empty() && static_cast<std::int64_t>(opt.selection_bias.size()) != e)
    throw Error("moe", "selection_bias has " + std::to_string(opt.selection_bias.size()) +
                           " values for " + std::to_string(e) + " experts");
  const Kokkos::View<T*> bias = opt.selection_bias.empty() ? Kokkos::View<T*>() : [&] {
    std::vector<T> b(opt.selection_bias.begin(), opt.selection_bias.end());
    return on_device(b, "gshard::moe_selection_bias");
  }();
  const Routing<T> r = route<T>(gates.local_view(), u.local_view(), g_local, valid_g, s, e, k, c,
                                opt.second_expert, !opt.dropless, bias);
  const ChoiceIndex choice(mesh, {g, s, k}, r.choice);
  const PerChoice keep(mesh, {g, s, k}, r.keep);

  // Gate values of the choices (differentiable), normalized over the k choices before drops.
  const PerChoice chosen = take_along<"E">(gates, choice, Bounds::trusted);
  const PerChoice weight = [&] {
    if (k == 1) return PerChoice(chosen * keep);
    return PerChoice(chosen / sum<"K">(chosen) * keep);
  }();

  // Statistics (not differentiated).
  std::vector<std::int64_t> per_expert(static_cast<std::size_t>(e));
  double dropped = 0;
  {
    NoGrad off;
    const std::vector<T> kept = sum<"G">(PerExpert(mesh, {g, e}, r.kept)).to_global();
    const std::vector<T> routed = sum<"G">(PerExpert(mesh, {g, e}, r.routed)).to_global();
    double kept_all = 0, routed_all = 0;
    for (std::size_t i = 0; i < kept.size(); ++i) {
      per_expert[i] = static_cast<std::int64_t>(kept[i]);
      kept_all += static_cast<double>(kept[i]);
      routed_all += static_cast<double>(routed[i]);
    }
    dropped = routed_all > 0 ? 1.0 - kept_all / routed_all : 0.0;
  }
  return R{logits,
           gates,
           ChoiceIndex(mesh, {g, s, k}, r.slot),
           typename R::SlotToken(mesh, {g, e, opt.dropless ? 0 : c}, r.token),
           weight,
           PerExpert(mesh, {g, e}, r.first),
           e,
           opt.dropless ? 0 : c,
           std::move(per_expert),
           dropped};
}

/// `l` also pending over the axes of `from` that `but` does not use.
constexpr Layout with_partials(Layout l, const DimLayout& from, const DimLayout& but) {
  for (int i = 0; i < from.axis_count; ++i)
    if (!but.uses(from.axes[i]) && !l.is_partial(from.axes[i]))
      l.partial[l.partial_count++] = from.axes[i];
  return l;
}

/// moe_experts with MoeOptions::dropless: one recorded op (moe_dropless.hpp) whose output is
/// pending over E's axes that G does not use (each copy along them computed its experts' share).
template <class X, class Wi, class Wo>
X moe_experts_dropless(const X& x, const MoeRouting<X>& r, const Wi& wi, const Wo& wo,
                       const MoeOptions& opt) {
  using T = typename X::value_type;
  using MeshT = typename X::mesh_type;
  constexpr Layout gsm = split_like(X::layout, 'G', "GSM");
  constexpr Layout gsk = split_like(X::layout, 'G', "GSK");
  constexpr Layout emh = split_like(Wi::layout, 'E', "EMH");
  constexpr Layout ehm = split_like(Wi::layout, 'E', "EHM");
  constexpr DimLayout e_dim = emh.dims[0];
  constexpr DimLayout g_dim = gsm.dims[0];
  // Pending sums: the output and the token-side cotangents over E's axes that G does not use,
  // the experts' cotangents over G's axes that E does not use.
  constexpr Layout out_layout = with_partials(gsm, e_dim, g_dim);
  constexpr Layout weight_grad = with_partials(gsk, e_dim, g_dim);
  constexpr Layout wi_grad = with_partials(emh, g_dim, e_dim);
  constexpr Layout wo_grad = with_partials(ehm, g_dim, e_dim);
  using Tokens = SpecTensor<T, MeshT, gsm>;
  using ExpertWi = SpecTensor<T, MeshT, emh>;
  using ExpertWo = SpecTensor<T, MeshT, ehm>;
  using Out = SpecTensor<T, MeshT, out_layout>;
  const MeshT& mesh = x.mesh();
  const auto xr = gshard::detail::materialise(reshard<Tokens>(x));
  const auto wir = gshard::detail::materialise(reshard<ExpertWi>(wi));
  const auto wor = gshard::detail::materialise(reshard<ExpertWo>(wo));
  const auto wr = gshard::detail::materialise(r.weight);
  const Shape xs = x.shape();
  const std::int64_t g = xs[0], s = xs[1], m = xs[2];
  const std::int64_t h = wi.shape()[2];
  auto sv = std::make_shared<DroplessSaved<T>>();
  const auto& ms = gshard::detail::mesh_state(mesh);
  sv->plan = dropless_plan(ms, e_dim, g_dim, r.experts, gshard::detail::mesh_axis_names<MeshT>(),
                           opt.hierarchical);
  sv->g_local = r.slot.local_shape()[0];
  sv->valid_g = r.slot.valid_extents()[0];
  sv->s = s, sv->k = r.slot.shape()[2], sv->m = m, sv->h = h;
  sv->rows = dropless_rows(sv->plan, ms, r.slot.local_view(), sv->g_local, sv->valid_g, s, sv->k, m,
                           opt.dropless_max_rows);
  sv->weight = wr.data, sv->wi = wir.data, sv->wo = wor.data;
  gshard::detail::RuntimeTensor<T> out(out_layout, {g, s, m}, dropless_forward(*sv, xr.data));
  gshard::detail::record(
      mesh, out, "moe dropless experts", std::source_location{},
      {xr.grad, wr.grad, wir.grad, wor.grad},
      [sv, g, s, m, h, e = r.experts, lx0 = out_layout, lw0 = weight_grad, lwi0 = wi_grad,
       lwo0 = wo_grad](const gshard::detail::RuntimeTensor<T>& ct) {
        const DroplessGrads<T> d = dropless_backward(*sv, ct.data);
        const Layout lx = gshard::detail::with_pending(lx0, ct.layout);
        const Layout lw = gshard::detail::with_pending(lw0, ct.layout);
        const Layout lwi = gshard::detail::with_pending(lwi0, ct.layout);
        const Layout lwo = gshard::detail::with_pending(lwo0, ct.layout);
        using RT = gshard::detail::RuntimeTensor<T>;
        using gshard::detail::AnyTensor;
        return gshard::detail::Cotangents{
            AnyTensor(RT(lx, {g, s, m}, d.x)), AnyTensor(RT(lw, {g, s, sv->k}, d.weight)),
            AnyTensor(RT(lwi, {e, m, h}, d.wi)), AnyTensor(RT(lwo, {e, h, m}, d.wo))};
      });
  return reshard<X>(gshard::detail::sharded_from<Out>(mesh, out));
}

/// Dispatch to the experts, their FFN, and the weighted combine back to x's layout.
template <class X, class Wi, class Wo>
X moe_experts(const X& x, const MoeRouting<X>& r, const Wi& wi, const Wo& wo,
              const MoeOptions& opt) {
  check_expert_operands<Wi, Wo>();
  if (opt.dropless) return moe_experts_dropless(x, r, wi, wo, opt);
  using T = typename X::value_type;
  using MeshT = typename X::mesh_type;
  constexpr Layout gecm = split_like(X::layout, 'G', "GECM");
  constexpr Layout ecgm = expert_layout(X::layout, Wi::layout, 'M');
  using Grouped = SpecTensor<T, MeshT, gecm>;
  using AtExperts = SpecTensor<T, MeshT, ecgm>;
  const std::int64_t e = r.experts, c = r.capacity;
  const Grouped dispatched = [&] {
    if (!opt.dense) return Grouped(take_along<"S">(x, r.token, Bounds::trusted));
    const auto onehot = one_hot<"F", T>(r.slot, e * c);  // "G S K F": zero rows for drops
    const auto mask = split<"F", "EC">(sum<"K">(onehot), {e, c});
    return Grouped(einsum<"GSEC,GSM->GECM">(mask, x));
  }();
  const AtExperts at_experts = reshard<AtExperts>(dispatched);
  const auto hidden = relu(einsum<"EGCM,EMH->EGCH">(at_experts, wi));
  const AtExperts y_experts = einsum<"EGCH,EHM->EGCM">(hidden, wo);
  const Grouped y = reshard<Grouped>(y_experts);
  if (!opt.dense) {
    const auto taken = take_along<"F">(merge<"EC", "F">(y), r.slot, Bounds::trusted);  // "G S K M"
    return X(einsum<"GSKM,GSK->GSM">(taken, r.weight));
  }
  const auto onehot = one_hot<"F", T>(r.slot, e * c);
  const auto combine = split<"F", "EC">(einsum<"GSK,GSKF->GSF">(r.weight, onehot), {e, c});
  return X(einsum<"GSEC,GECM->GSM">(combine, y));
}

/// The auxiliary load-balancing loss and the router z-loss (MoeResult), partial sums over G's
/// axes: {aux, z}.
template <class X>
auto moe_losses(const MoeRouting<X>& r) {
  const std::int64_t g = r.gates.shape()[0], s = r.gates.shape()[1];
  const auto m = mean<"S">(r.gates);  // "G E"
  auto aux =
      (einsum<"GE,GE->">(m, r.first) * (static_cast<double>(r.experts) / static_cast<double>(g)))
          .eval();
  constexpr Layout gs = split_like(X::layout, 'G', "GS");
  using PerToken = SpecTensor<typename X::value_type, typename X::mesh_type, gs>;
  const PerToken lse = logsumexp<"E">(r.logits);
  auto z = (einsum<"GS,GS->">(lse, lse) * (1.0 / static_cast<double>(g * s))).eval();
  return std::pair{std::move(aux), std::move(z)};
}

}  // namespace detail

/// The MoE layer: x "G S M" (tokens in groups), the router wg "M E", the experts' weights
/// wi "E M H" and wo "E H M" (E split over the expert axis or axes; any other splits are the
/// einsum rules' business). Collective over the mesh. Differentiable in x, wg, wi and wo.
template <class X, class Wg, class Wi, class Wo>
auto moe(const X& x, const Wg& wg, const Wi& wi, const Wo& wo, const MoeOptions& opt = {},
         std::source_location where = std::source_location::current()) {
  const gshard::detail::UserSite site(where, "nn::moe");
  detail::check_route_operands<X, Wg>();
  detail::check_expert_operands<Wi, Wo>();
  auto r = detail::moe_route(x, wg, opt);
  X out = detail::moe_experts(x, r, wi, wo, opt);
  auto [aux, z] = detail::moe_losses(r);
  return MoeResult<X, std::decay_t<decltype(aux)>>{
      std::move(out),     std::move(aux), std::move(z), std::move(r.tokens_per_expert),
      r.dropped_fraction, r.capacity};
}

}  // namespace gshard::nn
