// Optimizers (nn/optimizers.hpp), global-norm clipping (nn/clip.hpp) and learning-rate schedules
// (nn/schedules.hpp). Each optimizer runs 10 steps on three parameters of uneven global shapes
// (7x5 split on both labels, 9 replicated, 3x4x5 split on a leading and the last label) with
// fresh random gradients per step, on every listed mesh shape; after every step the parameters
// are compared with a naive single-rank implementation on the global values written here, and
// their padding must still hold zeros. Then clipping against a naive norm (one AllReduce), the
// schedules against their formulas, the communication of each optimizer, and errors.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "mpi_test.hpp"
// Included after mpi_test.hpp, as every library header.
#include <gshard/io/safetensors.hpp>
#include <gshard/nn/clip.hpp>
#include <gshard/nn/optimizers.hpp>
#include <gshard/nn/schedules.hpp>

#include "block_reference.hpp"
#include "op_checks.hpp"
#include "random_tensors.hpp"

namespace {

namespace nn = gshard::nn;
using gshard::Shape;
using gshard::test::for_block;
using gshard::test::Grid;
using gshard::test::grid_of;
using gshard::test::host_copy;
using gshard::test::sizes_text;
using gshard::test::TestMeshes;
using gshard::test::world_size;
using Int = std::int64_t;

// --- the naive reference: one parameter's global values and state ------------------------------

struct Ref {
  Shape shape;
  std::vector<double> p, m, v, row, col;
};

using RefStep = std::function<void(Ref&, const std::vector<double>& g, Int t)>;

RefStep sgd_ref(const nn::SgdOptions& o) {
  return [o](Ref& s, const std::vector<double>& g, Int t) {
    if (s.m.empty()) s.m.assign(g.size(), 0);
    const double lr = o.learning_rate(t);
    for (std::size_t i = 0; i < g.size(); ++i) {
      double d = g[i] + o.weight_decay * s.p[i];
      if (o.momentum != 0) {
        s.m[i] = t == 1 ? d : o.momentum * s.m[i] + d;
        d = o.nesterov ? d + o.momentum * s.m[i] : s.m[i];
      }
      s.p[i] -= lr * d;
    }
  };
}

RefStep adam_ref(const nn::AdamOptions& o) {
  return [o](Ref& s, const std::vector<double>& g, Int t) {
    if (s.m.empty()) s.m.assign(g.size(), 0), s.v.assign(g.size(), 0);
    const double lr = o.learning_rate(t);
    const double c1 = 1 - std::pow(o.beta1, static_cast<double>(t));
    const double c2 = 1 - std::pow(o.beta2, static_cast<double>(t));
    for (std::size_t i = 0; i < g.size(); ++i) {
      double d = g[i];
      if (o.decoupled_weight_decay)
        s.p[i] -= lr * o.weight_decay * s.p[i];
      else
        d += o.weight_decay * s.p[i];
      s.m[i] = o.beta1 * s.m[i] + (1 - o.beta1) * d;
      s.v[i] = o.beta2 * s.v[i] + (1 - o.beta2) * d * d;
      s.p[i] -= lr * (s.m[i] / c1) / (std::sqrt(s.v[i] / c2) + o.epsilon);
    }
  };
}

// As HF transformers' Adafactor (and Mesh-TensorFlow's), on the global tensor.
RefStep adafactor_ref(const nn::AdafactorOptions& opts) {
  return [opts](Ref& s, const std::vector<double>& g, Int t) {
    const std::size_t n = g.size();
    const bool factored = opts.factored && s.shape.size() >= 2;
    const double b2 = 1 - std::pow(static_cast<double>(t), -opts.decay_rate);
    std::vector<double> u(n);
    if (factored) {
      const Int R = s.shape[s.shape.size() - 2];
      const Int C = s.shape[s.shape.size() - 1];
      const Int O = static_cast<Int>(n) / (R * C);
      if (s.row.empty()) s.row.assign(static_cast<std::size_t>(O * R), 0);
      if (s.col.empty()) s.col.assign(static_cast<std::size_t>(O * C), 0);
      auto at = [&](Int o, Int r, Int c) { return static_cast<std::size_t>((o * R + r) * C + c); };
      for (Int o = 0; o < O; ++o) {
        for (Int r = 0; r < R; ++r) {
          double mean = 0;
          for (Int c = 0; c < C; ++c) mean += g[at(o, r, c)] * g[at(o, r, c)] + opts.epsilon1;
          auto& x = s.row[static_cast<std::size_t>(o * R + r)];
          x = b2 * x + (1 - b2) * mean / static_cast<double>(C);
        }
        for (Int c = 0; c < C; ++c) {
          double mean = 0;
          for (Int r = 0; r < R; ++r) mean += g[at(o, r, c)] * g[at(o, r, c)] + opts.epsilon1;
          auto& x = s.col[static_cast<std::size_t>(o * C + c)];
          x = b2 * x + (1 - b2) * mean / static_cast<double>(R);
        }
        double row_mean = 0;
        for (Int r = 0; r < R; ++r) row_mean += s.row[static_cast<std::size_t>(o * R + r)];
        row_mean /= static_cast<double>(R);
        for (Int r = 0; r < R; ++r)
          for (Int c = 0; c < C; ++c) {
            const double rf = 1 / std::sqrt(s.row[static_cast<std::size_t>(o * R + r)] / row_mean);
            const double cf = 1 / std::sqrt(s.col[static_cast<std::size_t>(o * C + c)]);
            u[at(o, r, c)] = g[at(o, r, c)] * rf * cf;
          }
      }
    } else {
      if (s.v.empty()) s.v.assign(n, 0);
      for (std::size_t i = 0; i < n; ++i) {
        s.v[i] = b2 * s.v[i] + (1 - b2) * (g[i] * g[i] + opts.epsilon1);
        u[i] = g[i] / std::sqrt(s.v[i]);
      }
    }
    double su = 0, sp = 0;
    for (std::size_t i = 0; i < n; ++i) su += u[i] * u[i], sp += s.p[i] * s.p[i];
    const double rms_u = std::sqrt(su / static_cast<double>(n));
    const double rms_p = std::sqrt(sp / static_cast<double>(n));
    double lr = opts.learning_rate ? (*opts.learning_rate)(t)
                                   : std::min(1e-2, 1 / std::sqrt(static_cast<double>(t)));
    if (opts.multiply_by_parameter_scale) lr *= std::max(opts.epsilon2, rms_p);
    const double clip = std::max(1.0, rms_u / opts.clipping_threshold);
    if (opts.beta1 > 0 && s.m.empty()) s.m.assign(n, 0);
    for (std::size_t i = 0; i < n; ++i) {
      double d = lr * u[i] / clip;
      if (opts.beta1 > 0) {
        s.m[i] = opts.beta1 * s.m[i] + (1 - opts.beta1) * d;
        d = s.m[i];
      }
      s.p[i] = s.p[i] - opts.weight_decay * lr * s.p[i] - d;
    }
  };
}

// --- comparing a parameter with its reference ----------------------------------------------------

template <class S>
std::vector<double> global_of(const S& x) {
  const auto v = x.to_global();
  return {v.begin(), v.end()};
}

// Padding of this rank's block (tests' own geometry) holds zeros.
template <class S>
bool padding_is_zero(const S& x) {
  const auto& mesh = x.mesh();
  std::vector<int> sizes(static_cast<std::size_t>(S::mesh_type::axis_count));
  for (std::size_t a = 0; a < sizes.size(); ++a) sizes[a] = mesh.axis_size(static_cast<int>(a));
  const Grid grid = grid_of(sizes, mesh.rank());
  const auto local = host_copy(x.local_view());
  bool ok = true;
  for_block(S::layout, x.shape(), grid, [&](Int i, Int g) {
    if (g < 0 && local[static_cast<std::size_t>(i)] != 0) ok = false;
  });
  return ok;
}

template <class S>
void check_param(const S& x, const Ref& ref, double tol, const std::string& what) {
  const auto got = global_of(x);
  double scale = 1, diff = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    scale = std::max(scale, std::abs(ref.p[i]));
    diff = std::max(diff, std::abs(got[i] - ref.p[i]));
    if (!std::isfinite(got[i])) diff = INFINITY;
  }
  INFO(what << ": max abs diff " << diff << " (scale " << scale << ")");
  CHECK(got.size() == ref.p.size());
  CHECK(diff <= tol * scale);
  CHECK(padding_is_zero(x));
}

// --- 10 steps of an optimizer on three parameters vs the reference ------------------------------

// Three parameters (a split matrix, a replicated vector, a 3-d tensor split on two labels) and
// their naive references; step t draws the same global gradients whatever the mesh and layouts.
const Shape ws{7, 5}, bs{9}, ks{3, 4, 5};

struct Refs {
  Ref w, b, k;
};

template <class W, class B, class K>
Refs refs_of(const W& w, const B& b, const K& k) {
  return {{ws, global_of(w), {}, {}, {}, {}},
          {bs, global_of(b), {}, {}, {}, {}},
          {ks, global_of(k), {}, {}, {}, {}}};
}

template <class Opt, class W, class B, class K>
void step_both(Opt& opt, W& w, B& b, K& k, Refs& r, const RefStep& ref, Int t) {
  const auto seed = static_cast<std::uint64_t>(1000 + 10 * t);
  const W gw = gshard::random_normal<W>(w.mesh(), ws, seed);
  const B gb = gshard::random_normal<B>(b.mesh(), bs, seed + 1, 0, 0.5);
  const K gk = gshard::random_normal<K>(k.mesh(), ks, seed + 2, 0, 2);
  opt.step(std::tie(w, b, k), std::tie(gw, gb, gk));
  ref(r.w, global_of(gw), t);
  ref(r.b, global_of(gb), t);
  ref(r.k, global_of(gk), t);
}

template <class T, class M, class Opt>
void run_case(const M& mesh, const std::string& mesh_text, Opt&& opt, const RefStep& ref,
              const std::string& name, double tol) {
  using W = gshard::Sharded<T, M, "A:x B:y">;
  using B = gshard::Sharded<T, M, "A">;
  using K = gshard::Sharded<T, M, "A:y B C:x">;
  W w = gshard::random_normal<W>(mesh, ws, 11);
  B b = gshard::random_normal<B>(mesh, bs, 12);
  K k = gshard::random_normal<K>(mesh, ks, 13);
  Refs r = refs_of(w, b, k);
  for (Int t = 1; t <= 10; ++t) {
    step_both(opt, w, b, k, r, ref, t);
    CHECK(opt.steps() == t);
    const std::string what = name + " on mesh " + mesh_text + ", step " + std::to_string(t);
    check_param(w, r.w, tol, what + ", W \"A:x B:y\" 7x5");
    check_param(b, r.b, tol, what + ", b \"A\" 9");
    check_param(k, r.k, tol, what + ", K \"A:y B C:x\" 3x4x5");
  }
}

template <class T, class M>
void all_cases(const M& mesh, const std::string& mesh_text, double tol) {
  {
    const nn::SgdOptions o{.learning_rate = 0.1};
    run_case<T>(mesh, mesh_text, nn::Sgd(o), sgd_ref(o), "SGD", tol);
  }
  {
    const nn::SgdOptions o{.learning_rate = nn::linear_warmup(0.1, 4), .momentum = 0.9};
    run_case<T>(mesh, mesh_text, nn::Sgd(o), sgd_ref(o), "SGD momentum, linear warm-up", tol);
  }
  {
    const nn::SgdOptions o{
        .learning_rate = 0.05, .momentum = 0.8, .nesterov = true, .weight_decay = 0.1};
    run_case<T>(mesh, mesh_text, nn::Sgd(o), sgd_ref(o), "SGD Nesterov, weight decay", tol);
  }
  {
    const nn::AdamOptions o{.learning_rate = nn::inverse_sqrt(0.01, 3)};
    run_case<T>(mesh, mesh_text, nn::Adam(o), adam_ref(o), "Adam, inverse sqrt", tol);
  }
  {
    const nn::AdamOptions o{.learning_rate = 0.01, .beta1 = 0.8, .weight_decay = 0.2};
    run_case<T>(mesh, mesh_text, nn::Adam(o), adam_ref(o), "Adam, L2 weight decay", tol);
  }
  {
    nn::AdamW opt({.learning_rate = nn::cosine(0.02, 2, 8, 0.1), .weight_decay = 0.3});
    CHECK(opt.options().decoupled_weight_decay);
    run_case<T>(mesh, mesh_text, opt, adam_ref(opt.options()), "AdamW, cosine", tol);
  }
  {
    const nn::AdafactorOptions o{};
    run_case<T>(mesh, mesh_text, nn::Adafactor(o), adafactor_ref(o),
                "Adafactor factored, relative step", tol);
  }
  {
    const nn::AdafactorOptions o{.learning_rate = nn::linear_warmup(0.05, 3),
                                 .beta1 = 0.9,
                                 .clipping_threshold = 0.5,
                                 .multiply_by_parameter_scale = false,
                                 .weight_decay = 0.1};
    run_case<T>(mesh, mesh_text, nn::Adafactor(o), adafactor_ref(o),
                "Adafactor with beta1, given lr, weight decay", tol);
  }
  {
    const nn::AdafactorOptions o{.learning_rate = 0.02, .decay_rate = 0.5, .factored = false};
    run_case<T>(mesh, mesh_text, nn::Adafactor(o), adafactor_ref(o), "Adafactor unfactored", tol);
  }
}

template <class F>
void for_each_mesh(F&& f) {
  TestMeshes meshes(world_size());
  for (const auto& m : meshes.m2) {
    const std::string text = sizes_text({m.axis_size(0), m.axis_size(1)});
    f(m, text);
  }
  for (const auto& m : meshes.m3) {
    const std::string text = sizes_text({m.axis_size(0), m.axis_size(1), m.axis_size(2)});
    f(m, text);
  }
}

// An Error thrown on every rank alike (or on none); returns its message.
template <class F>
std::string error_of(F&& f) {
  std::string message;
  int threw = 0;
  try {
    f();
  } catch (const gshard::Error& e) {
    message = e.what();
    threw = 1;
  }
  int all = threw;
  MPI_Allreduce(MPI_IN_PLACE, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(all == threw * world_size());
  return message;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST_CASE("optimizers, double: 10 steps on every mesh vs a naive reference") {
  for_each_mesh(
      [](const auto& mesh, const std::string& text) { all_cases<double>(mesh, text, 1e-10); });
}

TEST_CASE("optimizers, float: Adam and Adafactor vs a double reference") {
  for_each_mesh([](const auto& mesh, const std::string& text) {
    {
      const nn::AdamOptions o{.learning_rate = 0.01, .weight_decay = 0.1};
      run_case<float>(mesh, text, nn::Adam(o), adam_ref(o), "float Adam", 2e-5);
    }
    {
      const nn::AdafactorOptions o{.beta1 = 0.5};
      run_case<float>(mesh, text, nn::Adafactor(o), adafactor_ref(o), "float Adafactor", 2e-5);
    }
    {
      const nn::SgdOptions o{.learning_rate = 0.1, .momentum = 0.9};
      run_case<float>(mesh, text, nn::Sgd(o), sgd_ref(o), "float SGD", 2e-5);
    }
  });
}

// --- checkpointing: 4 steps on one mesh, save, load on another mesh, 6 more steps ---------------

// The same 10 steps as run_case, with the parameters and the optimizer's state saved after step 4
// on `mesh` and loaded into a fresh optimizer over parameters on a line of all ranks (another
// mesh type and other layouts): the result must still match the reference.
template <class T, class M, class MakeOpt>
void resume_case(const M& mesh, const std::string& mesh_text, MakeOpt make_opt, const RefStep& ref,
                 const std::string& name, double tol) {
  using Line = gshard::Mesh<"e">;
  using W = gshard::Sharded<T, M, "A:x B:y">;
  using B = gshard::Sharded<T, M, "A">;
  using K = gshard::Sharded<T, M, "A:y B C:x">;
  W w = gshard::random_normal<W>(mesh, ws, 11);
  B b = gshard::random_normal<B>(mesh, bs, 12);
  K k = gshard::random_normal<K>(mesh, ks, 13);
  Refs r = refs_of(w, b, k);
  // A file per process group, so that ctest's runs at 1, 2, 4 and 8 ranks do not meet.
  long long id = gshard::test::world_rank() == 0 ? static_cast<long long>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_LONG_LONG, 0, MPI_COMM_WORLD);
  const std::string path = std::filesystem::temp_directory_path().string() + "/gshard_opt_" +
                           std::to_string(id) + ".safetensors";
  {
    auto opt = make_opt();
    for (Int t = 1; t <= 4; ++t) step_both(opt, w, b, k, r, ref, t);
    gshard::io::SafetensorsWriter writer(mesh.comm());
    writer.add("w", w);
    writer.add("b", b);
    writer.add("k", k);
    opt.save(writer, std::tie(w, b, k));
    writer.write(path);
  }
  const Line line(MPI_COMM_WORLD, {world_size()});
  const gshard::io::SafetensorsReader reader(line.comm(), path);
  auto w2 = reader.read<gshard::Sharded<T, Line, "A B:e">>(line, "w");
  auto b2 = reader.read<gshard::Sharded<T, Line, "A:e">>(line, "b");
  auto k2 = reader.read<gshard::Sharded<T, Line, "A B:e C">>(line, "k");
  auto opt = make_opt();
  opt.load(reader, std::tie(w2, b2, k2));
  CHECK(opt.steps() == 4);
  for (Int t = 5; t <= 10; ++t) step_both(opt, w2, b2, k2, r, ref, t);
  CHECK(opt.steps() == 10);
  const std::string what = name + " saved on " + mesh_text + " at step 4, resumed on a line";
  check_param(w2, r.w, tol, what + ", W");
  check_param(b2, r.b, tol, what + ", b");
  check_param(k2, r.k, tol, what + ", K");
  MPI_Barrier(MPI_COMM_WORLD);
  if (gshard::test::world_rank() == 0) std::filesystem::remove(path);
}

TEST_CASE("optimizers: state saved on one mesh resumes on another") {
  for_each_mesh([](const auto& mesh, const std::string& text) {
    {
      const nn::SgdOptions o{.learning_rate = 0.05, .momentum = 0.8, .nesterov = true};
      resume_case<double>(
          mesh, text, [o] { return nn::Sgd(o); }, sgd_ref(o), "SGD Nesterov", 1e-10);
    }
    {
      nn::AdamWOptions o{.learning_rate = nn::cosine(0.02, 2, 8, 0.1), .weight_decay = 0.3};
      const nn::AdamW probe(o);
      resume_case<double>(
          mesh, text, [o] { return nn::AdamW(o); }, adam_ref(probe.options()), "AdamW", 1e-10);
    }
    {
      const nn::AdafactorOptions o{.beta1 = 0.9};
      resume_case<double>(
          mesh, text, [o] { return nn::Adafactor(o); }, adafactor_ref(o), "Adafactor factored",
          1e-10);
    }
    {
      const nn::AdafactorOptions o{.learning_rate = 0.02, .factored = false};
      resume_case<float>(
          mesh, text, [o] { return nn::Adafactor(o); }, adafactor_ref(o),
          "float Adafactor unfactored", 2e-5);
    }
  });
}

TEST_CASE("optimizers: communication per step") {
  for_each_mesh([](const auto& mesh, const std::string& text) {
    using M = std::remove_cvref_t<decltype(mesh)>;
    INFO("mesh " << text);
    using W = gshard::Sharded<double, M, "A:x B:y">;
    using B = gshard::Sharded<double, M, "A">;
    using K = gshard::Sharded<double, M, "A:y B C:x">;
    W w = gshard::random_normal<W>(mesh, {7, 5}, 1);
    B b = gshard::random_normal<B>(mesh, {9}, 2);
    K k = gshard::random_normal<K>(mesh, {3, 4, 5}, 3);
    const W gw = gshard::random_normal<W>(mesh, {7, 5}, 4);
    const B gb = gshard::random_normal<B>(mesh, {9}, 5);
    const K gk = gshard::random_normal<K>(mesh, {3, 4, 5}, 6);
    nn::Sgd sgd({.momentum = 0.9});
    nn::Adam adam;
    gshard::comm_counters().reset();
    sgd.step(std::tie(w, b, k), std::tie(gw, gb, gk));
    adam.step(std::tie(w, b, k), std::tie(gw, gb, gk));
    CHECK(gshard::comm_counters().total().calls == 0);
    // Adafactor: W (B:y, A:x) row sums over y, column sums and row means over x, RMS over x*y;
    // K (C:x, B whole) row sums over x, RMS over x*y; b replicated: nothing.
    nn::Adafactor ada;
    const int ax = mesh.axis_size(0), ay = mesh.axis_size(1);
    for (int step = 0; step < 2; ++step) {
      gshard::comm_counters().reset();
      ada.step(std::tie(w, b, k), std::tie(gw, gb, gk));
      const auto& c = gshard::comm_counters();
      CHECK(c.get("x", gshard::Collective::all_reduce).calls == (ax > 1 ? 3 : 0));
      CHECK(c.get("y", gshard::Collective::all_reduce).calls == (ay > 1 ? 1 : 0));
      CHECK(c.get("x*y", gshard::Collective::all_reduce).calls == (ax * ay > 1 ? 2 : 0));
      CHECK(c.total().calls == (ax > 1 ? 3 : 0) + (ay > 1 ? 1 : 0) + (ax * ay > 1 ? 2 : 0));
    }
  });
}

TEST_CASE("clip_by_global_norm: naive norm, one AllReduce, scaling") {
  for_each_mesh([](const auto& mesh, const std::string& text) {
    using M = std::remove_cvref_t<decltype(mesh)>;
    INFO("mesh " << text);
    using W = gshard::Sharded<double, M, "A:x B:y">;
    using B = gshard::Sharded<double, M, "A">;
    using K = gshard::Sharded<float, M, "A:y B C:x">;
    W w = gshard::random_normal<W>(mesh, {7, 5}, 21);
    B b = gshard::random_normal<B>(mesh, {9}, 22);
    K k = gshard::random_normal<K>(mesh, {3, 4, 5}, 23);
    const auto gw = global_of(w), gb = global_of(b), gk = global_of(k);
    double sum = 0;
    for (const auto* g : {&gw, &gb, &gk})
      for (double x : *g) sum += x * x;
    const double naive = std::sqrt(sum);

    gshard::comm_counters().reset();
    const double norm = nn::global_norm(std::tie(w, b, k));
    const int ranks = mesh.size();
    const std::string all = M::axis_count == 2 ? "x*y" : "x*y*z";
    CHECK(gshard::comm_counters().get(all, gshard::Collective::all_reduce).calls ==
          (ranks > 1 ? 1 : 0));
    CHECK(gshard::comm_counters().total().calls == (ranks > 1 ? 1 : 0));
    CHECK(std::abs(norm - naive) <= 1e-12 * naive);

    // Below the threshold: nothing changes.
    gshard::comm_counters().reset();
    CHECK(std::abs(nn::clip_by_global_norm(std::tie(w, b, k), 2 * naive) - naive) <= 1e-12 * naive);
    CHECK(gshard::comm_counters().total().calls == (ranks > 1 ? 1 : 0));
    CHECK(global_of(w) == gw);
    CHECK(global_of(b) == gb);
    CHECK(global_of(k) == gk);

    // Above: scaled by max / norm, and the new norm is max.
    const double max_norm = naive / 3;
    CHECK(std::abs(nn::clip_by_global_norm(std::tie(w, b, k), max_norm) - naive) <= 1e-12 * naive);
    const double f = max_norm / naive;
    auto check_scaled = [&](const std::vector<double>& got, const std::vector<double>& before,
                            double tol) {
      double diff = 0;
      for (std::size_t i = 0; i < got.size(); ++i)
        diff = std::max(diff, std::abs(got[i] - f * before[i]));
      CHECK(diff <= tol);
    };
    check_scaled(global_of(w), gw, 1e-14);
    check_scaled(global_of(b), gb, 1e-14);
    check_scaled(global_of(k), gk, 1e-6);
    CHECK(padding_is_zero(w));
    CHECK(padding_is_zero(k));
    CHECK(std::abs(nn::global_norm(std::tie(w, b, k)) - max_norm) <= 1e-6 * max_norm);
  });
}

TEST_CASE("schedules: values against their formulas") {
  const auto c = nn::constant(0.3);
  CHECK(c(1) == 0.3);
  CHECK(c(1000) == 0.3);

  const auto lw = nn::linear_warmup(0.5, 4);
  CHECK(lw(1) == doctest::Approx(0.125));
  CHECK(lw(3) == doctest::Approx(0.375));
  CHECK(lw(4) == 0.5);
  CHECK(lw(100) == 0.5);
  CHECK(nn::linear_warmup(0.5, 0)(1) == 0.5);

  const auto is = nn::inverse_sqrt(2.0, 100);
  CHECK(is(1) == doctest::Approx(0.02));
  CHECK(is(50) == doctest::Approx(1.0));
  CHECK(is(100) == doctest::Approx(2.0));
  CHECK(is(400) == doctest::Approx(1.0));
  CHECK(is(10000) == doctest::Approx(0.2));

  const auto cs = nn::cosine(1.0, 10, 110, 0.1);
  CHECK(cs(5) == doctest::Approx(0.5));
  CHECK(cs(10) == doctest::Approx(1.0));
  CHECK(cs(60) == doctest::Approx(0.1 + 0.9 * 0.5));
  CHECK(cs(35) == doctest::Approx(0.1 + 0.9 * 0.5 * (1 + std::cos(3.14159265358979 / 4))));
  CHECK(cs(110) == doctest::Approx(0.1));
  CHECK(cs(500) == doctest::Approx(0.1));
  CHECK(nn::cosine(3.0, 0, 4)(2) == doctest::Approx(1.5));

  const nn::LearningRate fixed = 0.25;
  CHECK(fixed(7) == 0.25);
  const nn::LearningRate lambda = [](std::int64_t t) { return 0.1 * static_cast<double>(t); };
  CHECK(lambda(3) == doctest::Approx(0.3));
  const nn::LearningRate scheduled = nn::inverse_sqrt(1.0, 4);
  CHECK(scheduled(16) == doctest::Approx(0.5));

  CHECK(contains(error_of([] { (void)nn::cosine(1.0, 10, 10); }), "total_steps"));
  CHECK(contains(error_of([] { (void)nn::inverse_sqrt(1.0, 0); }), "warmup_steps"));
  CHECK(contains(error_of([] { (void)nn::linear_warmup(1.0, -1); }), "warmup_steps"));
  CHECK(contains(error_of([] { (void)nn::cosine(1.0, 0, 10, 2.0); }), "final_fraction"));
}

TEST_CASE("optimizers: mistakes throw gshard::Error on every rank") {
  const int n = world_size();
  using M = gshard::Mesh<"x", "y">;
  const M mesh(MPI_COMM_WORLD, {n, 1});
  using W = gshard::Sharded<double, M, "A:x B:y">;
  using B = gshard::Sharded<double, M, "A">;
  W w = gshard::random_normal<W>(mesh, {7, 5}, 1);
  B b = gshard::random_normal<B>(mesh, {9}, 2);
  const W gw = gshard::random_normal<W>(mesh, {7, 5}, 3);
  const B gb = gshard::random_normal<B>(mesh, {9}, 4);
  const W wrong = gshard::random_normal<W>(mesh, {7, 4}, 5);

  // A gradient of another shape: nothing is updated.
  nn::Adam adam;
  const auto before = global_of(w);
  std::string m = error_of([&] { adam.step(std::tie(b, w), std::tie(gb, wrong)); });
  CHECK(contains(m, "gshard::Adam"));
  CHECK(contains(m, "parameter 1"));
  CHECK(contains(m, "[7, 4]"));
  CHECK(contains(m, "[7, 5]"));
  CHECK(adam.steps() == 0);
  CHECK(global_of(w) == before);

  // Another count of parameters after the first step.
  adam.step(std::tie(w, b), std::tie(gw, gb));
  m = error_of([&] { adam.step(std::tie(w), std::tie(gw)); });
  CHECK(contains(m, "1 parameters"));
  CHECK(contains(m, "made for 2"));
  CHECK(adam.steps() == 1);

  // Another shape, or another type, at a position after the first step.
  nn::Sgd sgd({.momentum = 0.5});
  sgd.step(std::tie(w, b), std::tie(gw, gb));
  W other = gshard::random_normal<W>(mesh, {7, 4}, 6);
  m = error_of([&] { sgd.step(std::tie(other, b), std::tie(wrong, gb)); });
  CHECK(contains(m, "gshard::Sgd"));
  CHECK(contains(m, "parameter 0"));
  CHECK(contains(m, "[7, 5] at the first step"));
  m = error_of([&] { sgd.step(std::tie(b, w), std::tie(gb, gw)); });
  CHECK(contains(m, "another type"));

  nn::Adafactor ada;
  m = error_of([&] { ada.step(std::tie(w), std::tie(wrong)); });
  CHECK(contains(m, "gshard::Adafactor"));
  CHECK(contains(m, "parameter 0"));

  // Options out of range, and a non-positive clipping norm.
  CHECK(contains(error_of([] { nn::Adam bad({.beta1 = 1.0}); }), "beta1"));
  CHECK(contains(error_of([] { nn::Sgd bad({.nesterov = true}); }), "Nesterov"));
  CHECK(contains(error_of([&] { (void)nn::clip_by_global_norm(std::tie(w), 0.0); }), "max_norm"));
}
