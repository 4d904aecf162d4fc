#pragma once
// A naive single-rank reference of the GShard MoE layer (shared/reference/gshard.md section 4,
// GShard Algorithms 1 and 2), in plain C++ on global values: std::vector<double>, plain loops,
// nothing from gshard. The distributed MoE layer is tested against it.
//
// Two formulations of the same layer:
//   moe_layer        index-based: per-expert slot counters (Algorithm 1 as a loop), gather into
//                    [E][G][C][M], expert FFN, scatter back with the gate weights;
//   moe_layer_dense  gshard.md's dense form: one-hot masks, positions by exclusive cumsum over S,
//                    combine[G][S][E][C], dispatch = (combine != 0) and the four einsums as loops.
// Both share the softmax, the top-k choice and the second-expert policy; capacity assignment,
// dispatch, FFN layout and combine are computed independently, and formulation_difference()
// compares them.
//
// Definitions (what the distributed layer must reproduce):
// - C = max(min_capacity, int(S * capacity_factor / E)) (Lingvo; int truncates toward zero).
// - gates = softmax(x wg) per token. Choice j = argmax of gates over the experts not chosen by
//   choices < j, ties to the smaller expert index. k = 1 is Switch, k = 2 GShard, k > 2 top-k.
// - normalize_gates: gate_j = gates[e_j] / sum over the k choices of gates[e_i], before any drop
//   (the paper); otherwise gate_j = gates[e_j]. Dropped choices are not renormalized away.
// - second_expert_policy (k == 2 only): all keeps every second choice; random keeps it iff
//   2 * gate_2 > u[g][s] (gate_2 as above); sampling draws e_2 from gates with e_1 masked out by
//   inverse CDF: with w_e = gates[e] for e != e_1 and w_{e_1} = 0, running sums P_e in expert order
//   and T = P_{E-1}, e_2 = the smallest e with w_e > 0 and P_e > u * T (else the largest e with
//   w_e > 0). A second choice skipped by the random policy takes no slot.
// - Slots: choice j of expert e takes position (number of earlier tokens in the group whose
//   choice j is e and was not skipped) + (number of choices < j of the group kept by e); it is
//   dropped when that position is >= C. So all first choices precede all second choices, etc.
// - aux loss: per group mean_e(m_e * c_e) * E^2 with m_e = mean over S of gates[e] and c_e =
//   fraction of the group's tokens whose FIRST choice is e, before capacity drops; the returned
//   value is the mean over groups. It is 1 for a perfectly balanced router.
// - router_z = mean over all G*S tokens of logsumexp(logits)^2; z_loss = z_loss_coefficient *
//   router_z. Input jitter is the caller's business (apply it to x first).
// - Layer: dispatched[e][g][c] = x of the token in slot c (zeros for an empty slot),
//   h = relu(dispatched wi_e), y = h wo_e, out[g][s] = sum over kept choices of gate_j *
//   y[e_j][g][pos_j]. A token dropped by all its choices gets zeros (the residual is the caller's).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace gshard::test::moe_ref {

using Int = std::int64_t;

enum class SecondExpertPolicy { all, random, sampling };

struct Options {
  Int k = 2;
  double capacity_factor = 2.0;
  Int min_capacity = 4;
  SecondExpertPolicy second_expert_policy = SecondExpertPolicy::all;
  bool normalize_gates = true;  // Switch (k = 1) uses raw gates: set false
  // DeepSeek-V3: added to the gates for the argmax choices only (empty: none); weights unbiased.
  std::vector<double> selection_bias;
  double z_loss_coefficient = 0.0;
};

// Global values, flat row-major.
struct Problem {
  Int G = 0, S = 0, M = 0, E = 0, H = 0;
  std::vector<double> x;         // [G][S][M]
  std::vector<double> wg;        // [M][E]
  std::vector<double> wi;        // [E][M][H]
  std::vector<double> wo;        // [E][H][M]
  std::vector<double> uniforms;  // [G][S] in [0, 1): random and sampling policies only
};

// Per (g, s, j), flat [G][S][k].
struct Routing {
  std::vector<Int> choice;    // the chosen expert, dropped or not
  std::vector<double> gate;   // its (normalized) gate, before dropping
  std::vector<Int> expert;    // choice, or -1 when skipped by the policy or over capacity
  std::vector<Int> position;  // slot in the expert's group buffer, or -1 likewise
  std::vector<char> skipped;  // skipped by the second-expert policy (random)
};

struct Stats {
  std::vector<Int> tokens_per_expert;  // [E] kept assignments, summed over groups
  Int assignments = 0;                 // G * S * k
  Int skipped_by_policy = 0;           // second choices the random policy did not take
  Int dropped_by_capacity = 0;         // assignments that asked for a slot and found none
  // dropped_by_capacity / (assignments - skipped_by_policy): of the assignments that asked for a
  // slot, the fraction that found none.
  double dropped_fraction = 0.0;
};

struct Result {
  Int C = 0;
  std::vector<double> logits;  // [G][S][E]
  std::vector<double> gates;   // [G][S][E]
  Routing routing;
  std::vector<double> dispatched;  // [E][G][C][M]
  std::vector<double> hidden;      // [E][G][C][H], after relu
  std::vector<double> expert_out;  // [E][G][C][M]
  std::vector<double> out;         // [G][S][M]
  double aux_loss = 0.0;
  double router_z = 0.0;
  double z_loss = 0.0;
  Stats stats;
};

struct DenseResult {
  Int C = 0;
  std::vector<double> combine;     // [G][S][E][C]
  std::vector<double> dispatch;    // [G][S][E][C], 0 or 1
  std::vector<double> dispatched;  // [E][G][C][M]
  std::vector<double> y;           // [G][E][C][M]
  std::vector<double> out;         // [G][S][M]
  double aux_loss = 0.0;
};

inline Int capacity(Int S, Int E, const Options& o) {
  const auto c =
      static_cast<Int>(static_cast<double>(S) * o.capacity_factor / static_cast<double>(E));
  return std::max(o.min_capacity, c);
}

namespace detail {

inline void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("moe_ref: ") + what);
}

inline void validate(const Problem& p, const Options& o) {
  require(p.G > 0 && p.S > 0 && p.M > 0 && p.E > 0 && p.H > 0, "sizes must be positive");
  require(p.x.size() == static_cast<std::size_t>(p.G * p.S * p.M), "x is not [G][S][M]");
  require(p.wg.size() == static_cast<std::size_t>(p.M * p.E), "wg is not [M][E]");
  require(p.wi.size() == static_cast<std::size_t>(p.E * p.M * p.H), "wi is not [E][M][H]");
  require(p.wo.size() == static_cast<std::size_t>(p.E * p.H * p.M), "wo is not [E][H][M]");
  require(o.k >= 1 && o.k <= p.E, "k must be in [1, E]");
  require(o.capacity_factor > 0 && o.min_capacity >= 0, "capacity_factor > 0, min_capacity >= 0");
  if (o.second_expert_policy != SecondExpertPolicy::all) {
    require(o.k == 2, "the random and sampling policies need k == 2");
    require(p.uniforms.size() == static_cast<std::size_t>(p.G * p.S), "uniforms is not [G][S]");
    for (double u : p.uniforms) require(u >= 0 && u < 1, "uniforms must lie in [0, 1)");
  }
}

inline std::vector<double> router_logits(const Problem& p) {
  std::vector<double> l(static_cast<std::size_t>(p.G * p.S * p.E), 0.0);
  for (Int t = 0; t < p.G * p.S; ++t)
    for (Int e = 0; e < p.E; ++e) {
      double a = 0;
      for (Int m = 0; m < p.M; ++m) a += p.x[t * p.M + m] * p.wg[m * p.E + e];
      l[t * p.E + e] = a;
    }
  return l;
}

// Softmax per token, and logsumexp per token.
inline void softmax(const std::vector<double>& l, Int tokens, Int E, std::vector<double>& gates,
                    std::vector<double>& lse) {
  gates.assign(l.size(), 0.0);
  lse.assign(static_cast<std::size_t>(tokens), 0.0);
  for (Int t = 0; t < tokens; ++t) {
    double mx = -std::numeric_limits<double>::infinity();
    for (Int e = 0; e < E; ++e) mx = std::max(mx, l[t * E + e]);
    double sum = 0;
    for (Int e = 0; e < E; ++e) sum += std::exp(l[t * E + e] - mx);
    for (Int e = 0; e < E; ++e) gates[t * E + e] = std::exp(l[t * E + e] - mx) / sum;
    lse[t] = mx + std::log(sum);
  }
}

// Softmax, top-k choices, gate normalization and the second-expert policy: shared by both
// formulations. Leaves expert/position unset.
inline Routing choose(const Problem& p, const Options& o, const std::vector<double>& gates) {
  const Int k = o.k, E = p.E;
  const auto n = static_cast<std::size_t>(p.G * p.S * k);
  Routing r;
  r.choice.assign(n, -1);
  r.gate.assign(n, 0.0);
  r.skipped.assign(n, 0);
  std::vector<char> taken(static_cast<std::size_t>(E));
  for (Int t = 0; t < p.G * p.S; ++t) {
    const double* g = &gates[static_cast<std::size_t>(t * E)];
    std::fill(taken.begin(), taken.end(), char{0});
    for (Int j = 0; j < k; ++j) {
      Int best = -1;
      if (j == 1 && o.second_expert_policy == SecondExpertPolicy::sampling) {
        const double u = p.uniforms[static_cast<std::size_t>(t)];
        std::vector<double> run(static_cast<std::size_t>(E));
        double acc = 0;
        for (Int e = 0; e < E; ++e) run[e] = acc += taken[e] ? 0.0 : g[e];
        const double total = run[E - 1];
        for (Int e = 0; e < E && best < 0; ++e)
          if (!taken[e] && g[e] > 0 && run[e] > u * total) best = e;
        for (Int e = E - 1; e >= 0 && best < 0; --e)
          if (!taken[e] && g[e] > 0) best = e;
        if (best < 0)  // every remaining gate underflowed to 0: fall back to argmax's rule
          for (Int e = 0; e < E && best < 0; ++e)
            if (!taken[e]) best = e;
      } else {
        const auto score = [&](Int e) {
          return o.selection_bias.empty() ? g[e]
                                          : g[e] + o.selection_bias[static_cast<std::size_t>(e)];
        };
        for (Int e = 0; e < E; ++e)
          if (!taken[e] && (best < 0 || score(e) > score(best))) best = e;  // ties to smaller e
      }
      taken[best] = 1;
      r.choice[t * k + j] = best;
      r.gate[t * k + j] = g[best];
    }
    if (o.normalize_gates) {
      double denom = 0;
      for (Int j = 0; j < k; ++j) denom += r.gate[t * k + j];
      for (Int j = 0; j < k; ++j) r.gate[t * k + j] /= denom;
    }
    if (o.second_expert_policy == SecondExpertPolicy::random)
      r.skipped[t * k + 1] = !(2.0 * r.gate[t * k + 1] > p.uniforms[static_cast<std::size_t>(t)]);
  }
  return r;
}

// Per group mean_e(m_e * c_e) * E^2, averaged over groups.
inline double aux_loss(const Problem& p, const std::vector<double>& gates,
                       const std::vector<Int>& first_choice_of_token) {
  double total = 0;
  for (Int g = 0; g < p.G; ++g) {
    double group = 0;
    for (Int e = 0; e < p.E; ++e) {
      double m = 0, c = 0;
      for (Int s = 0; s < p.S; ++s) {
        m += gates[(g * p.S + s) * p.E + e];
        c += first_choice_of_token[static_cast<std::size_t>(g * p.S + s)] == e ? 1.0 : 0.0;
      }
      group += (m / static_cast<double>(p.S)) * (c / static_cast<double>(p.S));
    }
    total += group / static_cast<double>(p.E) * static_cast<double>(p.E * p.E);
  }
  return total / static_cast<double>(p.G);
}

}  // namespace detail

// The index-based layer (Algorithm 1 as a loop over tokens, then gather / FFN / scatter).
inline Result moe_layer(const Problem& p, const Options& o) {
  detail::validate(p, o);
  const Int G = p.G, S = p.S, M = p.M, E = p.E, H = p.H, k = o.k;
  Result r;
  r.C = capacity(S, E, o);
  const Int C = r.C;
  r.logits = detail::router_logits(p);
  std::vector<double> lse;
  detail::softmax(r.logits, G * S, E, r.gates, lse);
  for (double v : lse) r.router_z += v * v;
  r.router_z /= static_cast<double>(G * S);
  r.z_loss = o.z_loss_coefficient * r.router_z;

  Routing& rt = r.routing;
  rt = detail::choose(p, o, r.gates);
  rt.expert.assign(rt.choice.size(), -1);
  rt.position.assign(rt.choice.size(), -1);
  std::vector<Int> first(static_cast<std::size_t>(G * S));
  for (Int t = 0; t < G * S; ++t) first[t] = rt.choice[t * k];
  r.aux_loss = detail::aux_loss(p, r.gates, first);

  // Slots: one counter per expert per group; choice j of every token before choice j + 1.
  Stats& st = r.stats;
  st.tokens_per_expert.assign(static_cast<std::size_t>(E), 0);
  st.assignments = G * S * k;
  std::vector<Int> filled(static_cast<std::size_t>(E));
  for (Int g = 0; g < G; ++g) {
    std::fill(filled.begin(), filled.end(), Int{0});
    for (Int j = 0; j < k; ++j)
      for (Int s = 0; s < S; ++s) {
        const Int a = (g * S + s) * k + j;
        if (rt.skipped[a]) {
          ++st.skipped_by_policy;
          continue;
        }
        const Int e = rt.choice[a];
        if (filled[e] < C) {
          rt.expert[a] = e;
          rt.position[a] = filled[e]++;
          ++st.tokens_per_expert[e];
        } else {
          ++st.dropped_by_capacity;
        }
      }
  }
  const Int asked = st.assignments - st.skipped_by_policy;
  st.dropped_fraction =
      asked > 0 ? static_cast<double>(st.dropped_by_capacity) / static_cast<double>(asked) : 0.0;

  // Gather, expert FFN, scatter.
  r.dispatched.assign(static_cast<std::size_t>(E * G * C * M), 0.0);
  for (Int g = 0; g < G; ++g)
    for (Int s = 0; s < S; ++s)
      for (Int j = 0; j < k; ++j) {
        const Int a = (g * S + s) * k + j;
        if (rt.expert[a] < 0) continue;
        const Int slot = ((rt.expert[a] * G + g) * C + rt.position[a]);
        for (Int m = 0; m < M; ++m) r.dispatched[slot * M + m] = p.x[(g * S + s) * M + m];
      }
  r.hidden.assign(static_cast<std::size_t>(E * G * C * H), 0.0);
  r.expert_out.assign(static_cast<std::size_t>(E * G * C * M), 0.0);
  for (Int e = 0; e < E; ++e)
    for (Int gc = 0; gc < G * C; ++gc) {
      const Int slot = e * G * C + gc;
      for (Int h = 0; h < H; ++h) {
        double a = 0;
        for (Int m = 0; m < M; ++m) a += r.dispatched[slot * M + m] * p.wi[(e * M + m) * H + h];
        r.hidden[slot * H + h] = std::max(a, 0.0);
      }
      for (Int m = 0; m < M; ++m) {
        double a = 0;
        for (Int h = 0; h < H; ++h) a += r.hidden[slot * H + h] * p.wo[(e * H + h) * M + m];
        r.expert_out[slot * M + m] = a;
      }
    }
  r.out.assign(static_cast<std::size_t>(G * S * M), 0.0);
  for (Int g = 0; g < G; ++g)
    for (Int s = 0; s < S; ++s)
      for (Int j = 0; j < k; ++j) {
        const Int a = (g * S + s) * k + j;
        if (rt.expert[a] < 0) continue;
        const Int slot = ((rt.expert[a] * G + g) * C + rt.position[a]);
        for (Int m = 0; m < M; ++m)
          r.out[(g * S + s) * M + m] += rt.gate[a] * r.expert_out[slot * M + m];
      }
  return r;
}

// The dense formulation, exactly gshard.md's steps and einsums, as loops.
inline DenseResult moe_layer_dense(const Problem& p, const Options& o) {
  detail::validate(p, o);
  const Int G = p.G, S = p.S, M = p.M, E = p.E, H = p.H, k = o.k;
  DenseResult d;
  d.C = capacity(S, E, o);
  const Int C = d.C;
  const std::vector<double> logits = detail::router_logits(p);
  std::vector<double> gates, lse;
  detail::softmax(logits, G * S, E, gates, lse);
  const Routing rt = detail::choose(p, o, gates);
  std::vector<Int> first(static_cast<std::size_t>(G * S));
  for (Int t = 0; t < G * S; ++t) first[t] = rt.choice[t * k];
  d.aux_loss = detail::aux_loss(p, gates, first);

  // mask_j[G][S][E] = onehot(e_j), zeroed where the policy skips; pos_j = exclusive cumsum of
  // mask_j over S + kept count of choices < j; kept where pos_j < C.
  const auto gse = static_cast<std::size_t>(G * S * E);
  d.combine.assign(static_cast<std::size_t>(G * S * E * C), 0.0);
  std::vector<double> kept_before(static_cast<std::size_t>(G * E), 0.0);
  for (Int j = 0; j < k; ++j) {
    std::vector<double> mask(gse, 0.0), pos(gse, 0.0);
    for (Int t = 0; t < G * S; ++t)
      if (!rt.skipped[t * k + j]) mask[t * E + rt.choice[t * k + j]] = 1.0;
    for (Int g = 0; g < G; ++g)
      for (Int e = 0; e < E; ++e) {
        double run = 0;
        for (Int s = 0; s < S; ++s) {
          pos[(g * S + s) * E + e] = run + kept_before[g * E + e];
          run += mask[(g * S + s) * E + e];
        }
      }
    for (std::size_t i = 0; i < gse; ++i) mask[i] *= pos[i] < static_cast<double>(C) ? 1.0 : 0.0;
    for (Int g = 0; g < G; ++g)
      for (Int s = 0; s < S; ++s)
        for (Int e = 0; e < E; ++e) {
          const Int i = (g * S + s) * E + e;
          kept_before[g * E + e] += mask[i];
          // combine += gate_j * mask_j (x) onehot(pos_j)
          for (Int c = 0; c < C; ++c)
            d.combine[i * C + c] +=
                rt.gate[(g * S + s) * k + j] * mask[i] * (pos[i] == static_cast<double>(c) ? 1 : 0);
        }
  }
  d.dispatch.assign(d.combine.size(), 0.0);
  for (std::size_t i = 0; i < d.combine.size(); ++i) d.dispatch[i] = d.combine[i] != 0 ? 1.0 : 0.0;

  // dispatched = einsum("GSEC,GSM->EGCM", dispatch, x)
  d.dispatched.assign(static_cast<std::size_t>(E * G * C * M), 0.0);
  for (Int e = 0; e < E; ++e)
    for (Int g = 0; g < G; ++g)
      for (Int c = 0; c < C; ++c)
        for (Int m = 0; m < M; ++m) {
          double a = 0;
          for (Int s = 0; s < S; ++s)
            a += d.dispatch[((g * S + s) * E + e) * C + c] * p.x[(g * S + s) * M + m];
          d.dispatched[((e * G + g) * C + c) * M + m] = a;
        }
  // h = relu(einsum("EGCM,EMH->EGCH", dispatched, wi))
  std::vector<double> h(static_cast<std::size_t>(E * G * C * H), 0.0);
  for (Int e = 0; e < E; ++e)
    for (Int g = 0; g < G; ++g)
      for (Int c = 0; c < C; ++c)
        for (Int q = 0; q < H; ++q) {
          double a = 0;
          for (Int m = 0; m < M; ++m)
            a += d.dispatched[((e * G + g) * C + c) * M + m] * p.wi[(e * M + m) * H + q];
          h[((e * G + g) * C + c) * H + q] = std::max(a, 0.0);
        }
  // y = einsum("EGCH,EHM->GECM", h, wo)
  d.y.assign(static_cast<std::size_t>(G * E * C * M), 0.0);
  for (Int g = 0; g < G; ++g)
    for (Int e = 0; e < E; ++e)
      for (Int c = 0; c < C; ++c)
        for (Int m = 0; m < M; ++m) {
          double a = 0;
          for (Int q = 0; q < H; ++q)
            a += h[((e * G + g) * C + c) * H + q] * p.wo[(e * H + q) * M + m];
          d.y[((g * E + e) * C + c) * M + m] = a;
        }
  // out = einsum("GSEC,GECM->GSM", combine, y)
  d.out.assign(static_cast<std::size_t>(G * S * M), 0.0);
  for (Int g = 0; g < G; ++g)
    for (Int s = 0; s < S; ++s)
      for (Int m = 0; m < M; ++m) {
        double a = 0;
        for (Int e = 0; e < E; ++e)
          for (Int c = 0; c < C; ++c)
            a += d.combine[((g * S + s) * E + e) * C + c] * d.y[((g * E + e) * C + c) * M + m];
        d.out[(g * S + s) * M + m] = a;
      }
  return d;
}

// The combine tensor [G][S][E][C] implied by an index-based routing.
inline std::vector<double> combine_of(const Problem& p, const Result& r, Int k) {
  std::vector<double> c(static_cast<std::size_t>(p.G * p.S * p.E * r.C), 0.0);
  for (Int t = 0; t < p.G * p.S; ++t)
    for (Int j = 0; j < k; ++j) {
      const Int a = t * k + j;
      if (r.routing.expert[a] >= 0)
        c[(t * p.E + r.routing.expert[a]) * r.C + r.routing.position[a]] += r.routing.gate[a];
    }
  return c;
}

// Self-check: the largest absolute difference between the two formulations over combine,
// dispatched tokens, expert outputs, the layer output and the aux loss (+inf if shapes differ).
inline double formulation_difference(const Problem& p, const Options& o) {
  const Result r = moe_layer(p, o);
  const DenseResult d = moe_layer_dense(p, o);
  if (r.C != d.C) return std::numeric_limits<double>::infinity();
  double diff = std::abs(r.aux_loss - d.aux_loss);
  auto cmp = [&diff](const std::vector<double>& a, const std::vector<double>& b) {
    if (a.size() != b.size()) {
      diff = std::numeric_limits<double>::infinity();
      return;
    }
    for (std::size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
  };
  cmp(combine_of(p, r, o.k), d.combine);
  cmp(r.dispatched, d.dispatched);
  cmp(r.out, d.out);
  // expert_out is [E][G][C][M], y is [G][E][C][M].
  std::vector<double> y(r.expert_out.size());
  const Int G = p.G, E = p.E, C = r.C, M = p.M;
  for (Int e = 0; e < E; ++e)
    for (Int g = 0; g < G; ++g)
      for (Int cm = 0; cm < C * M; ++cm)
        y[(g * E + e) * C * M + cm] = r.expert_out[(e * G + g) * C * M + cm];
  cmp(y, d.y);
  return diff;
}

}  // namespace gshard::test::moe_ref
