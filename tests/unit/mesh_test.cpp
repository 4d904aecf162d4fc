// Mesh: row-major coordinates, rank_at/coordinates_of, the axis sub-communicators and the
// errors for sizes that do not fit the communicator. Checked against our own index arithmetic
// and against MPI's own answers (ranks gathered over each sub-communicator).
#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include "mpi_test.hpp"

namespace {

using gshard::test::world_rank;
using gshard::test::world_size;

// Every way to write n as an ordered product of `count` positive factors.
std::vector<std::vector<int>> factorizations(int n, int count) {
  if (count == 1) return {{n}};
  std::vector<std::vector<int>> out;
  for (int f = 1; f <= n; ++f) {
    if (n % f != 0) continue;
    for (auto rest : factorizations(n / f, count - 1)) {
      rest.insert(rest.begin(), f);
      out.push_back(rest);
    }
  }
  return out;
}

// Row-major coordinates of rank r on a grid of `sizes`, the last axis fastest.
std::vector<int> row_major_coords(int r, const std::vector<int>& sizes) {
  std::vector<int> c(sizes.size());
  // stride of axis i = product of the sizes after it
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    int stride = 1;
    for (std::size_t j = i + 1; j < sizes.size(); ++j) stride *= sizes[j];
    c[i] = (r / stride) % sizes[i];
  }
  return c;
}

std::string sizes_string(const std::vector<int>& sizes) {
  std::string s;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) s += 'x';
    s += std::to_string(sizes[i]);
  }
  return s;
}

template <class M>
M make_mesh(MPI_Comm comm, const std::vector<int>& s) {
  if constexpr (M::axis_count == 2) {
    return M(comm, {s[0], s[1]});
  } else {
    return M(comm, {s[0], s[1], s[2]});
  }
}

// Checks coordinates, rank_at/coordinates_of and every group(mask) of a mesh over `comm`.
template <class M>
void check_mesh(const M& mesh, MPI_Comm comm, const std::vector<int>& sizes) {
  constexpr int n = M::axis_count;
  INFO("mesh sizes " << sizes_string(sizes));
  int comm_rank = 0;
  int comm_size = 0;
  MPI_Comm_rank(comm, &comm_rank);
  MPI_Comm_size(comm, &comm_size);
  // World ranks of the members of `comm`, in comm rank order.
  const int me_world = world_rank();
  std::vector<int> world_of(static_cast<std::size_t>(comm_size));
  MPI_Allgather(&me_world, 1, MPI_INT, world_of.data(), 1, MPI_INT, comm);

  CHECK(mesh.rank() == comm_rank);
  CHECK(mesh.size() == comm_size);
  int mesh_comm_size = 0;
  MPI_Comm_size(mesh.comm(), &mesh_comm_size);
  CHECK(mesh_comm_size == comm_size);
  // The mesh works on its own duplicate, never on the user's communicator itself.
  int cmp = MPI_UNEQUAL;
  MPI_Comm_compare(mesh.comm(), comm, &cmp);
  CHECK(cmp == MPI_CONGRUENT);

  const std::vector<int> mine = row_major_coords(comm_rank, sizes);
  for (int a = 0; a < n; ++a) {
    CHECK(mesh.axis_size(a) == sizes[static_cast<std::size_t>(a)]);
    CHECK(mesh.sizes()[static_cast<std::size_t>(a)] == sizes[static_cast<std::size_t>(a)]);
    CHECK(mesh.coordinates()[static_cast<std::size_t>(a)] == mine[static_cast<std::size_t>(a)]);
    CHECK(mesh.coordinate(a) == mine[static_cast<std::size_t>(a)]);
    CHECK(gshard::detail::mesh_state(mesh).coords[static_cast<std::size_t>(a)] ==
          mine[static_cast<std::size_t>(a)]);
    CHECK(gshard::detail::mesh_state(mesh).sizes[static_cast<std::size_t>(a)] ==
          sizes[static_cast<std::size_t>(a)]);
  }
  CHECK(gshard::detail::mesh_state(mesh).rank == comm_rank);
  CHECK(gshard::detail::mesh_state(mesh).size == comm_size);
  CHECK(gshard::detail::mesh_state(mesh).axis_count == n);

  // Every rank's coordinates, and the round trip.
  for (int r = 0; r < comm_size; ++r) {
    const std::vector<int> expect = row_major_coords(r, sizes);
    const auto c = mesh.coordinates_of(r);
    bool same = true;
    for (int a = 0; a < n; ++a)
      same = same && c[static_cast<std::size_t>(a)] == expect[static_cast<std::size_t>(a)];
    CHECK_MESSAGE(same, "coordinates_of(" << r << ")");
    CHECK(mesh.rank_at(c) == r);
  }

  // group(mask): the ranks that agree with this one on every axis outside the mask, ordered
  // row-major over the mask's axes.
  for (unsigned mask = 0; mask < (1u << n); ++mask) {
    INFO("group mask " << mask);
    const MPI_Comm g = mesh.group(mask);
    REQUIRE(g != MPI_COMM_NULL);
    int g_size = 0;
    int g_rank = 0;
    MPI_Comm_size(g, &g_size);
    MPI_Comm_rank(g, &g_rank);
    std::vector<int> expected;  // world ranks, in expected group order
    int expected_size = 1;
    for (int a = 0; a < n; ++a)
      if (mask & (1u << a)) expected_size *= sizes[static_cast<std::size_t>(a)];
    // Enumerate the group's members in row-major order over the masked axes: walk every comm
    // rank in order (row-major over all axes), keep those agreeing outside the mask. Since the
    // unmasked coordinates are fixed, comm-rank order is row-major order over the mask's axes.
    for (int r = 0; r < comm_size; ++r) {
      const std::vector<int> c = row_major_coords(r, sizes);
      bool agrees = true;
      for (int a = 0; a < n; ++a)
        if (!(mask & (1u << a)) &&
            c[static_cast<std::size_t>(a)] != mine[static_cast<std::size_t>(a)])
          agrees = false;
      if (agrees) expected.push_back(world_of[static_cast<std::size_t>(r)]);
    }
    CHECK(g_size == expected_size);
    REQUIRE(static_cast<int>(expected.size()) == expected_size);
    std::vector<int> members(static_cast<std::size_t>(g_size));
    MPI_Allgather(&me_world, 1, MPI_INT, members.data(), 1, MPI_INT, g);
    CHECK(members == expected);
    // This rank's place in the group = its row-major index over the masked axes.
    int index = 0;
    for (int a = 0; a < n; ++a)
      if (mask & (1u << a))
        index = index * sizes[static_cast<std::size_t>(a)] + mine[static_cast<std::size_t>(a)];
    CHECK(g_rank == index);
    if (mask == 0) {
      CHECK(g_size == 1);
    }
    // A sum over the group counts its members: the communicator really connects them.
    int one = 1;
    int count = 0;
    MPI_Allreduce(&one, &count, 1, MPI_INT, MPI_SUM, g);
    CHECK(count == expected_size);
  }
}

template <class M>
void check_every_factorization(MPI_Comm comm) {
  int size = 0;
  MPI_Comm_size(comm, &size);
  for (const auto& sizes : factorizations(size, M::axis_count)) {
    const M mesh = make_mesh<M>(comm, sizes);
    check_mesh(mesh, comm, sizes);
  }
}

// Runs `make` on every rank; checks each throws gshard::Error whose message contains every piece,
// and that every rank threw.
template <class Make>
void check_throws_everywhere(Make make, const std::vector<std::string>& pieces) {
  int threw = 0;
  std::string message;
  try {
    make();
  } catch (const gshard::Error& e) {
    threw = 1;
    message = e.what();
    CHECK(e.op() == "Mesh");
  }
  CHECK(threw == 1);
  INFO("message: " << message);
  for (const auto& p : pieces)
    CHECK_MESSAGE(message.find(p) != std::string::npos, "missing: " << p);
  int all = 0;
  MPI_Allreduce(&threw, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  CHECK(all == world_size());
}

}  // namespace

TEST_CASE("Mesh: two axes, every factorization of the world: coordinates and groups") {
  check_every_factorization<gshard::Mesh<"x", "y">>(MPI_COMM_WORLD);
}

TEST_CASE("Mesh: three axes, every factorization of the world: coordinates and groups") {
  check_every_factorization<gshard::Mesh<"x", "y", "z">>(MPI_COMM_WORLD);
}

TEST_CASE("Mesh: one axis and four axes") {
  const int n = world_size();
  const gshard::Mesh<"data"> line(MPI_COMM_WORLD, {n});
  CHECK(line.coordinates()[0] == world_rank());
  check_mesh(line, MPI_COMM_WORLD, {n});
  using M4 = gshard::Mesh<"a", "b", "c", "d">;
  for (const auto& s : factorizations(n, 4)) {
    const M4 mesh(MPI_COMM_WORLD, {s[0], s[1], s[2], s[3]});
    check_mesh(mesh, MPI_COMM_WORLD, s);
  }
}

TEST_CASE("Mesh: axis names and describe()") {
  const int n = world_size();
  using M = gshard::Mesh<"data", "expert">;
  static_assert(M::axis<"data">() == 0);
  static_assert(M::axis<"expert">() == 1);
  static_assert(M::axis_count == 2);
  const M mesh(MPI_COMM_WORLD, {1, n});
  CHECK(mesh.axis("data") == 0);
  CHECK(mesh.axis("expert") == 1);
  CHECK_THROWS_AS((void)mesh.axis("model"), gshard::Error);
  try {
    (void)mesh.axis("model");
  } catch (const gshard::Error& e) {
    const std::string what = e.what();
    CHECK(what.find("model") != std::string::npos);
  }
  CHECK(mesh.describe() == "Mesh<data=1, expert=" + std::to_string(n) + ">");
  const M other(MPI_COMM_WORLD, {n, 1});
  CHECK(other.describe() == "Mesh<data=" + std::to_string(n) + ", expert=1>");
}

TEST_CASE("Mesh: copies are handles to the same communicators") {
  const int n = world_size();
  const gshard::Mesh<"x", "y"> a(MPI_COMM_WORLD, {n, 1});
  const gshard::Mesh<"x", "y"> b = a;  // NOLINT: the copy is the point
  CHECK(a.comm() == b.comm());
  CHECK(&gshard::detail::mesh_state(a) == &gshard::detail::mesh_state(b));
  for (unsigned m = 0; m < 4; ++m) CHECK(a.group(m) == b.group(m));
  // Two meshes built separately have communicators of their own.
  const gshard::Mesh<"x", "y"> c(MPI_COMM_WORLD, {n, 1});
  CHECK(a.comm() != c.comm());
}

TEST_CASE("Mesh: on a split communicator (each half of the world its own mesh)") {
  const int n = world_size();
  const int me = world_rank();
  if (n < 2) {
    // One rank: the split is the world itself; still build a mesh on a derived communicator.
    MPI_Comm self_comm = MPI_COMM_NULL;
    MPI_Comm_split(MPI_COMM_WORLD, 0, me, &self_comm);
    check_mesh(gshard::Mesh<"x", "y">(self_comm, {1, 1}), self_comm, {1, 1});
    MPI_Comm_free(&self_comm);
    return;
  }
  const int lower = n / 2;  // not `half`: CUDA's fp16 header declares that name
  const int color = me < lower ? 0 : 1;
  MPI_Comm part = MPI_COMM_NULL;
  // Reverse key order in the upper half, so comm ranks differ from world-rank offsets.
  MPI_Comm_split(MPI_COMM_WORLD, color, color == 0 ? me : n - me, &part);
  int part_size = 0;
  int part_rank = 0;
  MPI_Comm_size(part, &part_size);
  MPI_Comm_rank(part, &part_rank);
  CHECK(part_size == (color == 0 ? lower : n - lower));
  {
    using M = gshard::Mesh<"x", "y">;
    for (const auto& s : factorizations(part_size, 2)) {
      const M mesh(part, {s[0], s[1]});
      check_mesh(mesh, part, s);
      // The whole-mesh group holds exactly this half's world ranks.
      const MPI_Comm all = mesh.group(3u);
      int g_size = 0;
      MPI_Comm_size(all, &g_size);
      std::vector<int> members(static_cast<std::size_t>(g_size));
      MPI_Allgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, all);
      std::vector<int> expected;
      for (int r = 0; r < n; ++r)
        if ((r < lower ? 0 : 1) == color) expected.push_back(r);
      if (color == 1) std::reverse(expected.begin(), expected.end());
      CHECK(members == expected);
    }
    // A mesh sized for the whole world does not fit a half.
    check_throws_everywhere(
        [&] {
          (void)M(part, {n, 1});
        },
        {std::to_string(n) + "x1", "communicator has " + std::to_string(part_size)});
  }
  MPI_Comm_free(&part);
}

TEST_CASE("Mesh: sizes that do not multiply to the communicator size throw on every rank") {
  const int n = world_size();
  using M = gshard::Mesh<"x", "y">;
  // Too many ranks asked for.
  check_throws_everywhere(
      [&] {
        (void)M(MPI_COMM_WORLD, {n + 1, 1});
      },
      {"gshard::Mesh: ", std::to_string(n + 1) + "x1", "make " + std::to_string(n + 1) + " ranks",
       "communicator has " + std::to_string(n)});
  check_throws_everywhere(
      [&] {
        (void)M(MPI_COMM_WORLD, {2, 2 * n});
      },
      {"2x" + std::to_string(2 * n), "make " + std::to_string(4 * n) + " ranks",
       "communicator has " + std::to_string(n)});
  if (n > 1) {
    // Too few.
    check_throws_everywhere(
        [&] {
          (void)M(MPI_COMM_WORLD, {1, n - 1});
        },
        {"1x" + std::to_string(n - 1), "communicator has " + std::to_string(n)});
  }
  using M3 = gshard::Mesh<"x", "y", "z">;
  check_throws_everywhere(
      [&] {
        (void)M3(MPI_COMM_WORLD, {n, 3, 1});
      },
      {std::to_string(n) + "x3x1", "communicator has " + std::to_string(n)});
}

TEST_CASE("Mesh: the wrong number of sizes throws on every rank") {
  const int n = world_size();
  using M = gshard::Mesh<"x", "y">;
  check_throws_everywhere([&] { (void)M(MPI_COMM_WORLD, {n}); }, {"2 axes", "1 sizes"});
  check_throws_everywhere([&] { (void)M(MPI_COMM_WORLD, {n, 1, 1}); }, {"2 axes", "3 sizes"});
  check_throws_everywhere([&] { (void)M(MPI_COMM_WORLD, {}); }, {"2 axes", "0 sizes"});
}

TEST_CASE("Mesh: an axis of size 0 (or negative) throws on every rank") {
  const int n = world_size();
  using M = gshard::Mesh<"x", "y">;
  check_throws_everywhere([&] { (void)M(MPI_COMM_WORLD, {0, n}); }, {"'x'", "size 0"});
  check_throws_everywhere([&] { (void)M(MPI_COMM_WORLD, {n, 0}); }, {"'y'", "size 0"});
  check_throws_everywhere([&] { (void)M(MPI_COMM_WORLD, {-1, -n}); }, {"'x'", "size -1"});
  // After the failures the world is still usable: a good mesh builds and its groups work.
  const M good(MPI_COMM_WORLD, {1, n});
  check_mesh(good, MPI_COMM_WORLD, {1, n});
}
