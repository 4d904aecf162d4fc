// The hierarchical (Tutel 2DH) AllToAllv: on every listed mesh shape, read as nodes x ranks per
// node, its result equals MPI_Alltoallv over the flat group element for element (float, double,
// int64; random uneven counts with zeros; packed and scattered displacements), and the counters
// show one small AllToAll of counts and one AllToAllv on the inner axis, then one AllToAllv on
// the outer axis, with the bytes the counts say.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "mpi_test.hpp"

#include <gshard/comm/hierarchical.hpp>

#include "block_reference.hpp"

namespace {

using gshard::Collective;
using gshard::comm_counters;
using gshard::test::listed_mesh_shapes;
using gshard::test::world_size;

std::string shape_text(const std::vector<int>& s) {
  std::string t;
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? "x" : "") + std::to_string(s[i]);
  return t;
}

/// The elements member `src` sends member `dst` in case `seed`: the same on every rank (a hash,
/// not a random stream), 0..max_count, about a quarter of the pairs zero.
int pair_count(int src, int dst, int seed, int max_count) {
  std::uint64_t h = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(seed + 1);
  h ^= static_cast<std::uint64_t>(src) * 0xbf58476d1ce4e5b9ull;
  h ^= static_cast<std::uint64_t>(dst) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  h *= 0xd6e8feb86ca6b5adull;
  h ^= h >> 29;
  if (h % 4 == 0) return 0;
  return static_cast<int>((h >> 8) % static_cast<std::uint64_t>(max_count + 1));
}

/// Element k of the piece src -> dst (exact in float for the sizes used).
template <class T>
T element(int src, int dst, int k, int members) {
  return static_cast<T>((src * members + dst) * 256 + k % 256);
}

/// Displacements for pieces of `counts` in member order (packed) or in reverse member order with
/// a gap of 3 before each piece (scattered).
std::vector<int> displacements(const std::vector<int>& counts, bool scattered, int& extent) {
  std::vector<int> d(counts.size());
  int at = 0;
  if (!scattered) {
    for (std::size_t j = 0; j < counts.size(); ++j) {
      d[j] = at;
      at += counts[j];
    }
  } else {
    for (std::size_t j = counts.size(); j-- > 0;) {
      at += 3;
      d[j] = at;
      at += counts[j];
    }
  }
  extent = at + 1;
  return d;
}

struct Groups {
  MPI_Comm inner, outer, flat;
  std::string inner_axes, outer_axes;
};

/// One exchange of case `seed` over `g`, checked against MPI_Alltoallv over the flat group and
/// against the counters.
template <class T>
void check_exchange(const Groups& g, int seed, int max_count, bool scattered_send,
                    bool scattered_recv) {
  const int n = gshard::detail::group_size(g.outer);
  const int l = gshard::detail::group_size(g.inner);
  const int p = n * l;
  int my_outer = 0, my_inner = 0, me = 0;
  MPI_Comm_rank(g.outer, &my_outer);
  MPI_Comm_rank(g.inner, &my_inner);
  MPI_Comm_rank(g.flat, &me);
  REQUIRE(me == my_outer * l + my_inner);  // the flat group's order is (outer, inner)

  std::vector<int> send_counts(p), recv_counts(p);
  for (int j = 0; j < p; ++j) {
    send_counts[j] = pair_count(me, j, seed, max_count);
    recv_counts[j] = pair_count(j, me, seed, max_count);
  }
  int send_extent = 0, recv_extent = 0;
  const std::vector<int> send_displs = displacements(send_counts, scattered_send, send_extent);
  const std::vector<int> recv_displs = displacements(recv_counts, scattered_recv, recv_extent);
  std::vector<T> send(static_cast<std::size_t>(send_extent), T(-1));
  for (int j = 0; j < p; ++j)
    for (int k = 0; k < send_counts[j]; ++k) send[send_displs[j] + k] = element<T>(me, j, k, p);

  const T untouched = T(-7);
  std::vector<T> got(static_cast<std::size_t>(recv_extent), untouched);
  std::vector<T> want(static_cast<std::size_t>(recv_extent), untouched);
  comm_counters().reset();
  gshard::detail::all_to_all_v_hierarchical(send.data(), send_counts, send_displs, got.data(),
                                            recv_counts, recv_displs, g.inner, g.outer,
                                            g.inner_axes, g.outer_axes);
  const gshard::CommCounters counts = comm_counters();
  REQUIRE(MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(),
                        gshard::detail::mpi_type<T>(), want.data(), recv_counts.data(),
                        recv_displs.data(), gshard::detail::mpi_type<T>(), g.flat) == MPI_SUCCESS);

  // Element for element against MPI (gaps included: nothing written outside the pieces), and
  // against what each source must have sent.
  int wrong = 0;
  for (int i = 0; i < recv_extent; ++i) wrong += got[i] != want[i] ? 1 : 0;
  for (int j = 0; j < p; ++j)
    for (int k = 0; k < recv_counts[j]; ++k)
      wrong += got[recv_displs[j] + k] != element<T>(j, me, k, p) ? 1 : 0;
  CHECK(wrong == 0);

  // The message pattern.
  const auto bytes = static_cast<std::int64_t>(sizeof(T));
  if (n == 1 || l == 1) {
    std::int64_t sent = 0;
    for (int j = 0; j < p; ++j)
      if (j != me) sent += send_counts[j];
    const std::string& axes = l == 1 ? g.outer_axes : g.inner_axes;
    CHECK(counts.get(axes, Collective::all_to_all_v).calls == 1);
    CHECK(counts.get(axes, Collective::all_to_all_v).bytes == sent * bytes);
    CHECK(counts.total().calls == 1);
    return;
  }
  std::int64_t step1 = 0;  // to inner peers: everything for members (any node, their index)
  for (int ji = 0; ji < l; ++ji)
    for (int jo = 0; jo < n; ++jo)
      if (ji != my_inner) step1 += send_counts[jo * l + ji];
  std::int64_t step2 = 0;  // to other nodes: every inner source's piece for (node, my index)
  for (int jo = 0; jo < n; ++jo)
    for (int si = 0; si < l; ++si)
      if (jo != my_outer)
        step2 += pair_count(my_outer * l + si, jo * l + my_inner, seed, max_count);
  CHECK(counts.get(g.inner_axes, Collective::all_to_all).calls == 1);
  CHECK(counts.get(g.inner_axes, Collective::all_to_all).bytes == (l - 1) * n * 4);
  CHECK(counts.get(g.inner_axes, Collective::all_to_all_v).calls == 1);
  CHECK(counts.get(g.inner_axes, Collective::all_to_all_v).bytes == step1 * bytes);
  CHECK(counts.get(g.outer_axes, Collective::all_to_all_v).calls == 1);
  CHECK(counts.get(g.outer_axes, Collective::all_to_all_v).bytes == step2 * bytes);
  CHECK(counts.total().calls == 3);
}

template <class T>
void check_every_case(const Groups& g) {
  // Growing then shrinking sizes: the reused staging must not leak an earlier call's data.
  const int max_counts[] = {5, 40, 0, 1, 300, 7};
  int seed = 0;
  for (const int max_count : max_counts)
    for (const bool scattered_send : {false, true})
      for (const bool scattered_recv : {false, true}) {
        CAPTURE(max_count);
        CAPTURE(scattered_send);
        CAPTURE(scattered_recv);
        check_exchange<T>(g, ++seed, max_count, scattered_send, scattered_recv);
      }
}

template <class T>
void check_every_mesh() {
  for (const auto& s : listed_mesh_shapes(world_size())) {
    INFO("mesh " << shape_text(s));
    if (s.size() == 2) {
      const gshard::Mesh<"node", "local"> mesh(MPI_COMM_WORLD, {s[0], s[1]});
      check_every_case<T>({mesh.group(2), mesh.group(1), mesh.group(3), "local", "node"});
    } else {
      // Three axes, split both ways into two levels.
      const gshard::Mesh<"node", "socket", "core"> mesh(MPI_COMM_WORLD, {s[0], s[1], s[2]});
      check_every_case<T>({mesh.group(6), mesh.group(1), mesh.group(7), "socket*core", "node"});
      check_every_case<T>({mesh.group(4), mesh.group(3), mesh.group(7), "core", "node*socket"});
    }
  }
}

}  // namespace

TEST_CASE("hierarchical all_to_all_v: float equals the flat MPI_Alltoallv") {
  check_every_mesh<float>();
}

TEST_CASE("hierarchical all_to_all_v: double equals the flat MPI_Alltoallv") {
  check_every_mesh<double>();
}

TEST_CASE("hierarchical all_to_all_v: int64 equals the flat MPI_Alltoallv") {
  check_every_mesh<std::int64_t>();
}

TEST_CASE("hierarchical all_to_all_v: counts of the wrong length are an error on every rank") {
  const int p = world_size();
  const gshard::Mesh<"node", "local"> mesh(MPI_COMM_WORLD, {1, p});
  std::vector<int> short_counts(static_cast<std::size_t>(p + 1), 0);
  std::vector<int> good(static_cast<std::size_t>(p), 0);
  float buffer = 0;
  CHECK_THROWS_AS(gshard::detail::all_to_all_v_hierarchical(&buffer, short_counts, short_counts,
                                                            &buffer, good, good, mesh.group(2),
                                                            mesh.group(1), "local", "node"),
                  gshard::Error);
}
