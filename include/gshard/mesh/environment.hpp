#pragma once
// gshard::Environment: brings MPI and Kokkos up and down in the right order, and leaves alone
// whatever the host application initialised itself.
#include <mpi.h>
#include <Kokkos_Core.hpp>
#include <cstdlib>
#include <cstring>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "../core/error.hpp"

namespace gshard {

namespace detail {

/// A training step allocates and frees the same large buffers every time. glibc serves blocks
/// over its mmap threshold (at most 32 MiB) with fresh mmap'd pages the kernel zeroes on first
/// touch: about 10% of an MoE step (docs/performance.md). Served from the heap and kept there
/// (trimmed only above 1 GiB free), the pages are reused. Process-wide, so only on request:
/// `requested`, or GSHARD_MALLOC_TUNING=1; GSHARD_MALLOC_TUNING=0 refuses. Once tuned, the
/// process stays tuned. Returns whether malloc is tuned now.
inline bool tune_malloc(bool requested) {
  static bool tuned = false;
#if defined(__GLIBC__)
  const char* setting = std::getenv("GSHARD_MALLOC_TUNING");
  if (setting != nullptr && std::strcmp(setting, "0") == 0) requested = false;
  if (setting != nullptr && std::strcmp(setting, "1") == 0) requested = true;
  if (requested && !tuned)
    tuned = mallopt(M_MMAP_MAX, 0) == 1 && mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
#else
  (void)requested;
#endif
  return tuned;
}

/// Kokkos::initialize(argc, argv) without "--help": Kokkos answers that flag with its own help
/// text, before the program's parser can print the program's. Kokkos' own options (and
/// --kokkos-help) still reach it and are removed from argv as usual; "--help" stays in argv,
/// where Kokkos leaves its unprefixed options.
inline void initialize_kokkos(int& argc, char** argv) {
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i)
    if (std::strcmp(argv[i], "--help") != 0) args.push_back(argv[i]);
  int n = static_cast<int>(args.size());
  args.push_back(nullptr);
  Kokkos::initialize(n, args.data());
  // Kokkos removed what it consumed from `args`, keeping the order: keep the same in argv.
  int out = 0;
  for (int i = 0, j = 0; i < argc; ++i) {
    const bool help = std::strcmp(argv[i], "--help") == 0;
    const bool kept = !help && j < n && args[static_cast<std::size_t>(j)] == argv[i];
    if (kept) ++j;
    if (help || kept) argv[out++] = argv[i];
  }
  for (int i = out; i < argc; ++i) argv[i] = nullptr;
  argc = out;
}

}  // namespace detail

/// What an Environment may change beyond starting MPI and Kokkos: nothing unless asked.
struct EnvironmentOptions {
  /// glibc: serve large blocks from the heap and keep them, process-wide (detail::tune_malloc;
  /// 2,790 -> 3,160 tokens/s on one rank of bench/moe). For programs that own their process.
  bool tune_malloc = false;
};

/// RAII scope for MPI and Kokkos. Starts MPI (MPI_THREAD_FUNNELED: only the main thread calls
/// MPI) unless the application already did, then Kokkos unless already initialised. The
/// destructor finalises only what this object started: Kokkos first, then MPI, because device
/// buffers must be gone before a CUDA-aware MPI shuts down. Changes no other process-wide
/// setting unless `options` asks. Every Sharded tensor and Kokkos::View must be destroyed before
/// the Environment is.
class Environment {
 public:
  Environment(int& argc, char**& argv, EnvironmentOptions options = {}) {
    start(&argc, &argv, options);
  }
  explicit Environment(EnvironmentOptions options = {}) { start(nullptr, nullptr, options); }

  Environment(const Environment&) = delete;
  Environment& operator=(const Environment&) = delete;
  Environment(Environment&&) = delete;
  Environment& operator=(Environment&&) = delete;

  ~Environment() {
    if (owns_kokkos_ && Kokkos::is_initialized()) Kokkos::finalize();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_mpi_ && !finalized) MPI_Finalize();
  }

  /// True when this object called MPI_Init_thread (and so will call MPI_Finalize).
  [[nodiscard]] bool owns_mpi() const noexcept { return owns_mpi_; }
  /// True when this object called Kokkos::initialize (and so will call Kokkos::finalize).
  [[nodiscard]] bool owns_kokkos() const noexcept { return owns_kokkos_; }
  /// The MPI thread level in force (as provided by MPI_Init_thread or MPI_Query_thread).
  [[nodiscard]] int mpi_thread_level() const noexcept { return thread_level_; }
  /// True when glibc's malloc serves large blocks from the heap (EnvironmentOptions::tune_malloc).
  [[nodiscard]] bool malloc_tuned() const noexcept { return malloc_tuned_; }

 private:
  void start(int* argc, char*** argv, EnvironmentOptions options) {
    malloc_tuned_ = detail::tune_malloc(options.tune_malloc);
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0) {
#if defined(OPEN_MPI) && defined(__unix__)
      // gshard's MPI-IO never uses shared file pointers. OMPIO picks its lockedfile component
      // per process, where it can create a lock file: with a directory writable on some hosts
      // only, the ranks pick differently and every open there hangs (docs/multihost.md). A
      // user's own choice (mpirun --mca sharedfp, OMPI_MCA_sharedfp) is kept.
      ::setenv("OMPI_MCA_sharedfp", "^lockedfile", 0);
#endif
      if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &thread_level_) != MPI_SUCCESS)
        throw Error("Environment", "MPI_Init_thread failed");
      owns_mpi_ = true;
    } else {
      MPI_Query_thread(&thread_level_);
    }
    if (!Kokkos::is_initialized()) {
      if (argc != nullptr && argv != nullptr) {
        detail::initialize_kokkos(*argc, *argv);
      } else {
        int no_argc = 0;
        Kokkos::initialize(no_argc, nullptr);
      }
      owns_kokkos_ = true;
    }
  }

  bool owns_mpi_ = false;
  bool owns_kokkos_ = false;
  bool malloc_tuned_ = false;
  int thread_level_ = MPI_THREAD_SINGLE;
};

}  // namespace gshard
