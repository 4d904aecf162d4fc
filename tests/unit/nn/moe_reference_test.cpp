// The naive MoE reference (tests/support/moe_reference.hpp) that the distributed MoE layer is
// tested against, tested itself: a hand-worked case, its index-based and dense formulations
// against each other on random problems (capacity overflow, groups of unequal fill, every
// policy, k = 1, 2, 3), routing invariants, the aux and z losses against hand formulas, the
// sampling policy's inverse CDF, and errors. The case "moe_ref: dump for numpy" (skipped unless
// asked for; tests/CMakeLists.txt runs it) writes cases that tests/unit/nn/moe_reference_check.py
// recomputes with numpy's einsum. Every rank does all the work on its own.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <random>
#include <string>
#include <vector>

#include "moe_reference.hpp"
#include "mpi_test.hpp"

namespace {

namespace mr = gshard::test::moe_ref;
using mr::Int;
using Policy = mr::SecondExpertPolicy;

// Platform-stable uniforms in [0, 1) (std distributions differ between standard libraries).
struct Uniform {
  std::mt19937_64 engine;
  explicit Uniform(std::uint64_t seed) : engine(seed) {}
  double operator()() { return static_cast<double>(engine() >> 11) * 0x1.0p-53; }
  double in(double lo, double hi) { return lo + (hi - lo) * (*this)(); }
  Int below(Int n) { return static_cast<Int>(engine() % static_cast<std::uint64_t>(n)); }
};

// Random weights; `skew` adds a per-group bias to x along a per-group direction of wg so that
// groups load the experts unequally; `ties` makes experts 1 and 3 copies of 0 and 2 in wg, so
// their gates tie exactly.
mr::Problem random_problem(Uniform& u, Int G, Int S, Int M, Int E, Int H, double skew,
                           bool ties = false) {
  mr::Problem p;
  p.G = G, p.S = S, p.M = M, p.E = E, p.H = H;
  auto fill = [&u](std::vector<double>& v, std::size_t n, double scale) {
    v.resize(n);
    for (double& a : v) a = u.in(-scale, scale);
  };
  fill(p.x, static_cast<std::size_t>(G * S * M), 1.0);
  fill(p.wg, static_cast<std::size_t>(M * E), 1.5);
  fill(p.wi, static_cast<std::size_t>(E * M * H), 1.0);
  fill(p.wo, static_cast<std::size_t>(E * H * M), 1.0);
  if (ties)
    for (Int m = 0; m < M; ++m) {
      p.wg[m * E + 1] = p.wg[m * E];
      p.wg[m * E + 3] = p.wg[m * E + 2];
    }
  for (Int g = 0; g < G; ++g) {
    const Int favourite = u.below(E);
    for (Int s = 0; s < S; ++s)
      for (Int m = 0; m < M; ++m)
        p.x[(g * S + s) * M + m] += skew * static_cast<double>(g % 2) * p.wg[m * E + favourite];
  }
  p.uniforms.resize(static_cast<std::size_t>(G * S));
  for (double& a : p.uniforms) a = u();
  return p;
}

struct Config {
  Int G, S, M, E, H;
  mr::Options o;
  double skew;
  bool ties = false;
};

mr::Options options(Int k, double cf, Int min_c, Policy policy, bool normalize, double z = 0) {
  mr::Options o;
  o.k = k;
  o.capacity_factor = cf;
  o.min_capacity = min_c;
  o.second_expert_policy = policy;
  o.normalize_gates = normalize;
  o.z_loss_coefficient = z;
  return o;
}

// A selection bias (DeepSeek-V3) that favours the last experts.
mr::Options biased(mr::Options o, Int E) {
  for (Int e = 0; e < E; ++e) o.selection_bias.push_back(0.05 * static_cast<double>(e));
  return o;
}

std::vector<Config> configs() {
  return {
      {2, 8, 4, 4, 3, options(2, 2.0, 4, Policy::all, true), 0.0},
      {3, 9, 5, 4, 6, options(2, 1.0, 1, Policy::all, true), 3.0},      // overflow, skewed groups
      {2, 12, 3, 6, 4, options(2, 0.5, 0, Policy::random, true), 2.0},  // C = 1
      {4, 7, 4, 3, 5, options(2, 1.5, 2, Policy::sampling, true), 1.0},
      {3, 10, 4, 5, 3, options(1, 1.0, 1, Policy::all, false, 1e-3), 4.0},  // Switch top-1
      {2, 11, 6, 5, 4, options(3, 1.0, 1, Policy::all, true), 2.0},         // top-3
      {1, 16, 4, 8, 4, options(2, 0.25, 0, Policy::all, false), 5.0},       // C = 0: all dropped
      {5, 6, 3, 2, 2, options(2, 2.0, 1, Policy::random, false), 1.0},
      {2, 10, 4, 5, 3, options(3, 1.0, 1, Policy::all, true), 1.0, true},  // exact ties
      {2, 9, 4, 4, 3, options(2, 1.5, 1, Policy::sampling, true), 1.0, true},
      {3, 8, 4, 4, 3, options(2, 4.0, 1, Policy::all, true), 2.0},  // C = S: dropless's regime
      {2, 10, 4, 5, 3, biased(options(2, 1.0, 1, Policy::random, true), 5), 1.0},
      {2, 12, 4, 6, 3, biased(options(3, 6.0, 1, Policy::all, true), 6), 2.0},  // C = S, biased
  };
}

// Positions of each (group, expert) are exactly 0..n-1, n <= C, every choice j of an expert
// precedes every choice j + 1 of it, positions grow with s within a choice, and the stats add up.
void check_invariants(const mr::Problem& p, const mr::Options& o, const mr::Result& r) {
  const Int G = p.G, S = p.S, E = p.E, k = o.k;
  const auto& rt = r.routing;
  std::vector<Int> kept_total(static_cast<std::size_t>(E), 0);
  Int skipped = 0, dropped = 0;
  for (Int g = 0; g < G; ++g)
    for (Int e = 0; e < E; ++e) {
      std::vector<Int> slot_owner(static_cast<std::size_t>(r.C), -1);
      Int last_pos = -1, n = 0;
      bool dropped_earlier_choice = false;
      for (Int j = 0; j < k; ++j)
        for (Int s = 0; s < S; ++s) {
          const Int a = (g * S + s) * k + j;
          if (rt.choice[a] != e) continue;
          if (rt.skipped[a]) {
            CHECK(rt.expert[a] == -1);
            CHECK(rt.position[a] == -1);
            continue;
          }
          if (rt.expert[a] < 0) {
            CHECK(rt.position[a] == -1);
            dropped_earlier_choice = true;
            continue;
          }
          CHECK(rt.expert[a] == e);
          REQUIRE(rt.position[a] >= 0);
          REQUIRE(rt.position[a] < r.C);
          CHECK(slot_owner[rt.position[a]] == -1);  // no slot gets two tokens
          slot_owner[rt.position[a]] = s;
          CHECK(rt.position[a] > last_pos);
          // Once a choice of e was dropped for capacity, no later one is kept.
          CHECK_FALSE(dropped_earlier_choice);
          last_pos = rt.position[a];
          ++n;
        }
      CHECK(n <= r.C);
      CHECK(last_pos == n - 1);  // dense: 0..n-1
      kept_total[e] += n;
    }
  for (Int a = 0; a < G * S * k; ++a) {
    skipped += rt.skipped[a] ? 1 : 0;
    dropped += !rt.skipped[a] && rt.expert[a] < 0 ? 1 : 0;
    // The random policy: skipped iff not 2 * gate_2 > u.
    if (o.second_expert_policy == Policy::random && a % k == 1)
      CHECK(bool(rt.skipped[a]) == !(2 * rt.gate[a] > p.uniforms[a / k]));
  }
  CHECK(r.stats.tokens_per_expert == kept_total);
  CHECK(r.stats.assignments == G * S * k);
  CHECK(r.stats.skipped_by_policy == skipped);
  CHECK(r.stats.dropped_by_capacity == dropped);
  const Int asked = G * S * k - skipped;
  CHECK(r.stats.dropped_fraction ==
        doctest::Approx(asked ? static_cast<double>(dropped) / static_cast<double>(asked) : 0.0));
  // Choices of a token are distinct experts, and the first is the argmax of the gates plus the
  // selection bias (ties to smaller e).
  const auto score = [&](Int t, Int e) {
    return r.gates[t * E + e] + (o.selection_bias.empty() ? 0.0 : o.selection_bias[e]);
  };
  for (Int t = 0; t < G * S; ++t) {
    for (Int j = 0; j < k; ++j)
      for (Int i = 0; i < j; ++i) CHECK(rt.choice[t * k + i] != rt.choice[t * k + j]);
    Int best = 0;
    for (Int e = 1; e < E; ++e)
      if (score(t, e) > score(t, best)) best = e;
    CHECK(rt.choice[t * k] == best);
  }
}

TEST_CASE("moe_ref: a hand-worked top-2 case") {
  // wg = identity, so logits = x. Four tokens, two experts, C = int(4 * 1 / 2) = 2.
  mr::Problem p;
  p.G = 1, p.S = 4, p.M = 2, p.E = 2, p.H = 2;
  p.x = {1, 0, 0, 2, 3, 0, 0, 0};
  p.wg = {1, 0, 0, 1};
  p.wi = {1, 0, 0, 1, 2, 0, 0, 2};  // wi_e = (e + 1) I
  p.wo = {1, 0, 0, 1, 1, 0, 0, 1};  // wo_e = I
  const mr::Result r = mr::moe_layer(p, options(2, 1.0, 1, Policy::all, true));
  REQUIRE(r.C == 2);
  // First choices: t0 e0 pos0, t1 e1 pos0, t2 e0 pos1, t3 (tie) e0 pos2 dropped. Second choices
  // start after the kept first ones: t0 e1 pos1 kept, t1 e0 pos2, t2 e1 pos2, t3 e1 pos3 dropped.
  CHECK(r.routing.choice == std::vector<Int>{0, 1, 1, 0, 0, 1, 0, 1});
  CHECK(r.routing.expert == std::vector<Int>{0, 1, 1, -1, 0, -1, -1, -1});
  CHECK(r.routing.position == std::vector<Int>{0, 1, 0, -1, 1, -1, -1, -1});
  CHECK(r.stats.tokens_per_expert == std::vector<Int>{2, 2});
  CHECK(r.stats.dropped_by_capacity == 4);
  CHECK(r.stats.dropped_fraction == 0.5);
  const double e1 = std::exp(1.0), e2 = std::exp(2.0), e3 = std::exp(3.0);
  const std::vector<double> want = {
      e1 / (e1 + 1) * 1 + 1 / (e1 + 1) * 2, 0, 0, e2 / (e2 + 1) * 4, e3 / (e3 + 1) * 3, 0, 0, 0};
  REQUIRE(r.out.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) CHECK(r.out[i] == doctest::Approx(want[i]));
  const double m0 = (e1 / (e1 + 1) + 1 / (1 + e2) + e3 / (e3 + 1) + 0.5) / 4;
  CHECK(r.aux_loss == doctest::Approx((m0 * 0.75 + (1 - m0) * 0.25) / 2 * 4));
  CHECK(mr::formulation_difference(p, options(2, 1.0, 1, Policy::all, true)) < 1e-12);
}

TEST_CASE("moe_ref: index-based and dense formulations agree") {
  Uniform u(20260703);
  Int overflowing = 0, unequal = 0, skipped = 0;
  for (const Config& c : configs()) {
    for (int rep = 0; rep < 3; ++rep) {
      const mr::Problem p = random_problem(u, c.G, c.S, c.M, c.E, c.H, c.skew, c.ties);
      CAPTURE(c.G);
      CAPTURE(c.S);
      CAPTURE(c.E);
      CAPTURE(c.o.k);
      CAPTURE(rep);
      CHECK(mr::formulation_difference(p, c.o) < 1e-12);
      const mr::Result r = mr::moe_layer(p, c.o);
      check_invariants(p, c.o, r);
      overflowing += r.stats.dropped_by_capacity > 0 ? 1 : 0;
      skipped += r.stats.skipped_by_policy;
      // Groups of unequal fill: some expert's kept count differs between groups.
      bool differs = false;
      for (Int e = 0; e < c.E && c.G > 1; ++e) {
        std::vector<Int> per_group(static_cast<std::size_t>(c.G), 0);
        for (Int a = 0; a < c.G * c.S * c.o.k; ++a)
          if (r.routing.expert[a] == e) ++per_group[a / (c.S * c.o.k)];
        differs |= std::adjacent_find(per_group.begin(), per_group.end(), std::not_equal_to<>()) !=
                   per_group.end();
      }
      unequal += differs ? 1 : 0;
      // The dense combine's row sums are the kept gates.
      const mr::DenseResult d = mr::moe_layer_dense(p, c.o);
      for (Int t = 0; t < c.G * c.S; ++t) {
        double row = 0, kept = 0;
        for (Int ec = 0; ec < c.E * d.C; ++ec) row += d.combine[t * c.E * d.C + ec];
        for (Int j = 0; j < c.o.k; ++j)
          if (r.routing.expert[t * c.o.k + j] >= 0) kept += r.routing.gate[t * c.o.k + j];
        CHECK(row == doctest::Approx(kept));
      }
    }
  }
  // The cases exercised what they claim to.
  CHECK(overflowing >= 10);
  CHECK(unequal >= 10);
  CHECK(skipped > 0);
}

TEST_CASE("moe_ref: aux and z losses against hand formulas") {
  Uniform u(7);
  const Int G = 3, S = 10, M = 4, E = 5, H = 3;
  mr::Problem p = random_problem(u, G, S, M, E, H, 0.0);
  SUBCASE("uniform gates (wg = 0): aux = 1, router_z = log(E)^2, everyone's first choice is 0") {
    std::fill(p.wg.begin(), p.wg.end(), 0.0);
    const mr::Result r = mr::moe_layer(p, options(2, 2.0, 1, Policy::all, true, 0.5));
    CHECK(r.aux_loss == doctest::Approx(1.0).epsilon(1e-14));
    const double lz = std::log(static_cast<double>(E));
    CHECK(r.router_z == doctest::Approx(lz * lz).epsilon(1e-14));
    CHECK(r.z_loss == doctest::Approx(0.5 * lz * lz).epsilon(1e-14));
    for (Int t = 0; t < G * S; ++t) {
      CHECK(r.routing.choice[t * 2] == 0);
      CHECK(r.routing.choice[t * 2 + 1] == 1);
      CHECK(r.routing.gate[t * 2] == doctest::Approx(0.5));
    }
  }
  SUBCASE("a router that sends everything to expert 0") {
    // logits = (L, 0, ..., 0) for every token: m_0 = e^L / (e^L + E - 1), m_e = 1 / (e^L + E - 1),
    // c_0 = 1 and c_e = 0, so aux = E^2 * (m_0 * 1) / E = E * m_0.
    const double L = 3.0;
    std::fill(p.wg.begin(), p.wg.end(), 0.0);
    p.wg[0] = L;
    for (Int t = 0; t < G * S; ++t) p.x[t * M] = 1.0;
    const mr::Result r = mr::moe_layer(p, options(1, 1.0, 1, Policy::all, false, 1.0));
    const double m0 = std::exp(L) / (std::exp(L) + static_cast<double>(E - 1));
    CHECK(r.aux_loss == doctest::Approx(static_cast<double>(E) * m0).epsilon(1e-13));
    CHECK(r.aux_loss > 1.0);
    const double lse = std::log(std::exp(L) + static_cast<double>(E - 1));
    CHECK(r.z_loss == doctest::Approx(lse * lse).epsilon(1e-13));
    // Only C = int(S / E) = 2 tokens per group fit.
    CHECK(r.stats.tokens_per_expert == std::vector<Int>{G * 2, 0, 0, 0, 0});
    CHECK(r.stats.dropped_fraction ==
          doctest::Approx(static_cast<double>(S - 2) / static_cast<double>(S)));
  }
  SUBCASE("random gates: aux from its definition") {
    const mr::Result r = mr::moe_layer(p, options(2, 2.0, 1, Policy::all, true));
    double want = 0;
    for (Int g = 0; g < G; ++g) {
      double sum = 0;
      for (Int e = 0; e < E; ++e) {
        double m = 0, c = 0;
        for (Int s = 0; s < S; ++s) {
          m += r.gates[(g * S + s) * E + e] / static_cast<double>(S);
          c += r.routing.choice[(g * S + s) * 2] == e ? 1.0 / static_cast<double>(S) : 0.0;
        }
        sum += m * c;
      }
      want += sum / static_cast<double>(E) * static_cast<double>(E * E) / static_cast<double>(G);
    }
    CHECK(r.aux_loss == doctest::Approx(want).epsilon(1e-13));
  }
}

TEST_CASE("moe_ref: capacity") {
  mr::Options o;
  o.capacity_factor = 1.25, o.min_capacity = 0;
  CHECK(mr::capacity(8, 4, o) == 2);  // int(2.5)
  o.min_capacity = 4;
  CHECK(mr::capacity(8, 4, o) == 4);
  o.capacity_factor = 2.0, o.min_capacity = 1;
  CHECK(mr::capacity(1024, 16, o) == 128);  // C = 2S/E
}

TEST_CASE("moe_ref: the sampling policy draws the second expert by inverse CDF") {
  // N identical tokens with u = (i + 0.5) / N: expert e must be drawn about N * w_e / T times.
  const Int N = 2000, E = 4;
  mr::Problem p;
  p.G = 1, p.S = N, p.M = E, p.E = E, p.H = 1;
  p.wg.assign(static_cast<std::size_t>(E * E), 0.0);
  for (Int e = 0; e < E; ++e) p.wg[e * E + e] = 1.0;
  const std::vector<double> logits = {0.3, 1.2, -0.4, 0.9};
  for (Int s = 0; s < N; ++s) p.x.insert(p.x.end(), logits.begin(), logits.end());
  p.wi.assign(static_cast<std::size_t>(E * E), 1.0);
  p.wo.assign(static_cast<std::size_t>(E * E), 1.0);
  for (Int s = 0; s < N; ++s)
    p.uniforms.push_back((static_cast<double>(s) + 0.5) / static_cast<double>(N));
  const mr::Result r = mr::moe_layer(p, options(2, 2.0, 1, Policy::sampling, true));
  std::vector<double> w(E);
  double total = 0;
  for (Int e = 0; e < E; ++e) total += w[e] = e == 1 ? 0.0 : std::exp(logits[e]);
  std::vector<Int> drawn(E, 0);
  for (Int s = 0; s < N; ++s) {
    CHECK(r.routing.choice[s * 2] == 1);
    ++drawn[r.routing.choice[s * 2 + 1]];
  }
  for (Int e = 0; e < E; ++e)
    CHECK(std::abs(static_cast<double>(drawn[e]) - static_cast<double>(N) * w[e] / total) <= 1.0);
  // u increasing draws experts in increasing order (the CDF runs in expert order).
  for (Int s = 1; s < N; ++s) CHECK(r.routing.choice[s * 2 + 1] >= r.routing.choice[s * 2 - 1]);
}

TEST_CASE("moe_ref: errors") {
  Uniform u(3);
  const mr::Problem p = random_problem(u, 2, 4, 3, 4, 2, 0.0);
  CHECK_THROWS_AS(mr::moe_layer(p, options(5, 2.0, 1, Policy::all, true)), std::invalid_argument);
  CHECK_THROWS_AS(mr::moe_layer(p, options(3, 2.0, 1, Policy::random, true)),
                  std::invalid_argument);
  mr::Problem bad = p;
  bad.uniforms.pop_back();
  CHECK_THROWS_AS(mr::moe_layer(bad, options(2, 2.0, 1, Policy::sampling, true)),
                  std::invalid_argument);
  bad = p;
  bad.wo.pop_back();
  CHECK_THROWS_AS(mr::moe_layer_dense(bad, options(2, 2.0, 1, Policy::all, true)),
                  std::invalid_argument);
}

// --- cases for the numpy check (tests/unit/nn/moe_reference_check.py) -------------------------

template <class V>
void write(std::ofstream& f, const char* key, const V& v) {
  f << key;
  for (const auto& a : v) f << ' ' << a;
  f << '\n';
}

TEST_CASE("moe_ref: dump for numpy" * doctest::skip()) {
  const char* path = std::getenv("GSHARD_MOE_REF_DUMP");
  REQUIRE_MESSAGE(path != nullptr, "set GSHARD_MOE_REF_DUMP to the file to write");
  if (gshard::test::world_rank() != 0) return;
  std::ofstream f(path);
  REQUIRE(f.good());
  f << std::setprecision(17);
  Uniform u(424242);
  for (const Config& c : configs()) {
    const mr::Problem p = random_problem(u, c.G, c.S, c.M, c.E, c.H, c.skew, c.ties);
    const mr::Result r = mr::moe_layer(p, c.o);
    const mr::DenseResult d = mr::moe_layer_dense(p, c.o);
    f << "case\n";
    write(f, "sizes", std::vector<Int>{c.G, c.S, c.M, c.E, c.H, c.o.k, c.o.min_capacity});
    write(f, "options",
          std::vector<double>{c.o.capacity_factor,
                              static_cast<double>(static_cast<int>(c.o.second_expert_policy)),
                              c.o.normalize_gates ? 1.0 : 0.0, c.o.z_loss_coefficient});
    write(f, "x", p.x), write(f, "wg", p.wg), write(f, "wi", p.wi), write(f, "wo", p.wo);
    write(f, "u", p.uniforms);
    write(f, "bias", c.o.selection_bias);
    write(f, "C", std::vector<Int>{r.C});
    write(f, "out", r.out), write(f, "combine", d.combine), write(f, "dispatch", d.dispatch);
    write(f, "expert", r.routing.expert), write(f, "position", r.routing.position);
    write(f, "tokens_per_expert", r.stats.tokens_per_expert);
    write(f, "losses", std::vector<double>{r.aux_loss, r.router_z, r.z_loss});
    write(f, "dropped",
          std::vector<double>{static_cast<double>(r.stats.dropped_by_capacity),
                              static_cast<double>(r.stats.skipped_by_policy),
                              r.stats.dropped_fraction});
  }
  f << "end\n";
  REQUIRE(f.good());
}

}  // namespace
