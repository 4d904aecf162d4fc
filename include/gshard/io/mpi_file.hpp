#pragma once
// Collective file access for global tensors: each rank reads or writes its own block of a
// row-major tensor stored at some offset of a file, through an MPI-IO subarray file view. Nothing
// is gathered to one rank. Errors are agreed, so every rank throws the same gshard::Error.
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <bit>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#if defined(__unix__)
#include <fcntl.h>
#include <unistd.h>
#endif

#include "../comm/agree.hpp"
#include "../comm/collectives.hpp"
#include "../tensor/local_index.hpp"
#include "../tensor/sharded.hpp"
#include "format.hpp"

namespace gshard::io {

static_assert(
    std::endian::native == std::endian::little,
    "gshard::io writes tensors' bytes as they are in memory; the formats are little-endian");

namespace detail {

using gshard::detail::agree;
using gshard::detail::agree_on;

inline std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<std::size_t>(length));
}

/// An MPI file opened by every rank of a communicator; closed (collectively) by close() or the
/// destructor. Every failure throws the same gshard::Error on every rank.
class MpiFile {
 public:
  MpiFile(MPI_Comm comm, const std::string& path, int mode, std::string op)
      : comm_(comm), path_(path), op_(std::move(op)) {
    int rc = MPI_SUCCESS;
    {
      const gshard::detail::CollectiveWatch watch("MPI_File_open", "", comm);
      rc = MPI_File_open(comm, path.c_str(), mode, MPI_INFO_NULL, &fh_);
    }
    std::string error;
    if (rc != MPI_SUCCESS) {
      fh_ = MPI_FILE_NULL;
      error = "cannot open " + path + ": " + mpi_error_text(rc);
    }
    // Open is collective but may fail on some ranks only: close where it worked, then agree.
    const std::string e = gshard::detail::first_message(comm, error);
    if (!e.empty()) {
      if (fh_ != MPI_FILE_NULL) MPI_File_close(&fh_);
      throw Error(op_, e);
    }
  }
  MpiFile(const MpiFile&) = delete;
  MpiFile& operator=(const MpiFile&) = delete;
  ~MpiFile() {
    if (fh_ != MPI_FILE_NULL) MPI_File_close(&fh_);
  }

  [[nodiscard]] MPI_File handle() const { return fh_; }
  [[nodiscard]] MPI_Comm comm() const { return comm_; }
  [[nodiscard]] const std::string& path() const { return path_; }
  [[nodiscard]] const std::string& op() const { return op_; }
  [[nodiscard]] int rank() const {
    int r = 0;
    MPI_Comm_rank(comm_, &r);
    return r;
  }

  /// The file's size, the same on every rank.
  [[nodiscard]] std::uint64_t size() const {
    MPI_Offset s = 0;
    check(MPI_File_get_size(fh_, &s), "size of");
    return static_cast<std::uint64_t>(s);
  }

  /// Rank 0 reads `n` bytes at `at` and every rank gets them. Collective.
  [[nodiscard]] std::string read_on_root(std::uint64_t at, std::uint64_t n) const {
    std::string bytes(n, '\0');
    std::string error;
    if (rank() == 0) {
      MPI_Status st;
      const int rc = MPI_File_read_at(fh_, static_cast<MPI_Offset>(at), bytes.data(),
                                      static_cast<int>(n), MPI_BYTE, &st);
      int got = 0;
      MPI_Get_count(&st, MPI_BYTE, &got);
      if (rc != MPI_SUCCESS)
        error = "cannot read " + path_ + ": " + mpi_error_text(rc);
      else if (static_cast<std::uint64_t>(got) != n)
        error = path_ + ": read " + std::to_string(got) + " of " + std::to_string(n) + " bytes";
    }
    agree(comm_, op_, error);
    const gshard::detail::CollectiveWatch watch("Bcast (file contents)", "", comm_);
    MPI_Bcast(bytes.data(), static_cast<int>(n), MPI_BYTE, 0, comm_);
    return bytes;
  }

  /// Rank 0 writes `bytes` at `at`. Collective (agrees on the outcome).
  void write_on_root(std::uint64_t at, const std::string& bytes) const {
    std::string error;
    if (rank() == 0) {
      MPI_Status st;
      const int rc = MPI_File_write_at(fh_, static_cast<MPI_Offset>(at), bytes.data(),
                                       static_cast<int>(bytes.size()), MPI_BYTE, &st);
      if (rc != MPI_SUCCESS) error = "cannot write " + path_ + ": " + mpi_error_text(rc);
    }
    agree(comm_, op_, error);
  }

  void set_size(std::uint64_t n) const {
    int rc = MPI_SUCCESS;
    {
      const gshard::detail::CollectiveWatch watch("MPI_File_set_size", "", comm_);
      rc = MPI_File_set_size(fh_, static_cast<MPI_Offset>(n));
    }
    check(rc, "resize");
  }
  /// Flushes to storage, then closes. Collective.
  void sync_and_close() {
    int rc = MPI_SUCCESS;
    {
      const gshard::detail::CollectiveWatch watch("MPI_File_sync", "", comm_);
      rc = MPI_File_sync(fh_);
    }
    check(rc, "flush");
    {
      const gshard::detail::CollectiveWatch watch("MPI_File_close", "", comm_);
      rc = MPI_File_close(&fh_);
    }
    fh_ = MPI_FILE_NULL;
    agree(comm_, op_, rc == MPI_SUCCESS ? "" : "cannot close " + path_ + ": " + mpi_error_text(rc));
  }

  /// Agrees on an MPI call's result (the call itself was made on every rank).
  void check(int rc, std::string_view what) const {
    agree(comm_, op_,
          rc == MPI_SUCCESS
              ? std::string()
              : std::string("cannot ").append(what).append(" ").append(path_).append(": ").append(
                    mpi_error_text(rc)));
  }

 private:
  MPI_Comm comm_;
  MPI_File fh_ = MPI_FILE_NULL;
  std::string path_;
  std::string op_;
};

/// A committed MPI datatype, freed on scope exit.
class TypeHandle {
 public:
  /// Takes and commits `t` (nothing for MPI_DATATYPE_NULL).
  explicit TypeHandle(MPI_Datatype t) : t_(t) {
    if (t_ != MPI_DATATYPE_NULL) MPI_Type_commit(&t_);
  }
  TypeHandle(const TypeHandle&) = delete;
  TypeHandle& operator=(const TypeHandle&) = delete;
  ~TypeHandle() {
    if (t_ != MPI_DATATYPE_NULL) MPI_Type_free(&t_);
  }
  [[nodiscard]] MPI_Datatype get() const { return t_; }

 private:
  MPI_Datatype t_ = MPI_DATATYPE_NULL;
};

/// What a rank reads or writes of a tensor's global array: its valid block, found in its padded
/// local block. `owner` says whether it is the one copy that writes (coordinate 0 on every axis
/// that does not split the tensor); every rank reads.
struct FileBlock {
  std::vector<int> global, local, valid, offset;
  std::int64_t elements = 0;  // of the valid block
  bool owner = true;
};

template <class S>
FileBlock file_block(const S& t, const std::string& op, const std::string& name) {
  const auto& mesh = t.mesh();
  FileBlock b;
  const Layout& layout = S::layout;
  b.elements = 1;
  for (int d = 0; d < layout.rank; ++d) {
    const std::int64_t n = t.shape()[static_cast<std::size_t>(d)];
    if (n > INT_MAX)
      throw Error(op, "tensor \"" + name + "\": dimension " + std::to_string(d) + " of " +
                          std::to_string(n) + " exceeds MPI-IO's int extents");
    const gshard::detail::Block blk =
        gshard::detail::block_of(layout.dims[d], n, mesh.sizes(), mesh.coordinates());
    b.global.push_back(static_cast<int>(n));
    b.local.push_back(static_cast<int>(blk.chunk));
    b.valid.push_back(static_cast<int>(blk.valid));
    b.offset.push_back(static_cast<int>(std::min(blk.offset, n)));
    b.elements *= blk.valid;
  }
  b.owner = gshard::detail::writes_block(layout, mesh.coordinates(),
                                         gshard::detail::mesh_state(mesh).axis_count);
  return b;
}

/// Collective over the tensor's mesh: reads (write=false) or writes this rank's block of `t`
/// stored row-major at byte `at` of `file`. Writers are the owners; every rank reads.
template <class S>
void transfer_block(const MpiFile& file, std::uint64_t at, const S& t, bool write,
                    const std::string& name) {
  using T = typename S::value_type;
  static_assert(S::layout.partial_count == 0,
                "gshard::io: a tensor with pending partial sums (+axis) has no value to read or "
                "write; reshard it to a layout without +axis first");
  const FileBlock b = file_block(t, file.op(), name);
  const MPI_Datatype element = gshard::detail::mpi_type<T>();
  const bool active = b.elements > 0 && (!write || b.owner);
  MPI_Datatype m = MPI_DATATYPE_NULL, f = MPI_DATATYPE_NULL;
  if (active && !b.global.empty()) {
    const std::vector<int> zeros(b.global.size(), 0);
    const int n = static_cast<int>(b.global.size());
    MPI_Type_create_subarray(n, b.local.data(), b.valid.data(), zeros.data(), MPI_ORDER_C, element,
                             &m);
    MPI_Type_create_subarray(n, b.global.data(), b.valid.data(), b.offset.data(), MPI_ORDER_C,
                             element, &f);
  }
  const TypeHandle memory(m), view(f);
  // The view's filetype differs per rank; etype and data representation are the same.
  {
    const gshard::detail::CollectiveWatch watch("MPI_File_set_view", "", file.comm());
    file.check(MPI_File_set_view(file.handle(), static_cast<MPI_Offset>(at), element,
                                 view.get() != MPI_DATATYPE_NULL ? view.get() : element, "native",
                                 MPI_INFO_NULL),
               "set a file view on");
  }
  auto host = Kokkos::create_mirror_view(t.local_view());
  if (write) Kokkos::deep_copy(host, t.local_view());
  const MPI_Datatype type = memory.get() != MPI_DATATYPE_NULL ? memory.get() : element;
  MPI_Status st;
  int rc = MPI_SUCCESS;
  {
    const gshard::detail::CollectiveWatch watch(write ? "MPI_File_write_all" : "MPI_File_read_all",
                                                "", file.comm());
    rc = write ? MPI_File_write_all(file.handle(), host.data(), active ? 1 : 0, type, &st)
               : MPI_File_read_all(file.handle(), host.data(), active ? 1 : 0, type, &st);
  }
  std::string error;
  if (rc != MPI_SUCCESS)
    error = std::string(write ? "cannot write" : "cannot read") + " tensor \"" + name + "\" of " +
            file.path() + ": " + mpi_error_text(rc);
  agree(file.comm(), file.op(), error);
  if (!write) {
    Kokkos::deep_copy(t.local_view(), host);
    gshard::detail::mark_updated(t, "a file read");
  }
  // Back to a plain byte view for header access.
  const gshard::detail::CollectiveWatch watch("MPI_File_set_view", "", file.comm());
  file.check(MPI_File_set_view(file.handle(), 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL),
             "reset the file view of");
}

/// The tensor's checksum (io::element_hash summed over its elements), the same on every rank.
/// Collective over the tensor's mesh.
template <class S>
std::uint64_t checksum(const S& t) {
  const auto& mesh = t.mesh();
  auto host = Kokkos::create_mirror_view(t.local_view());
  Kokkos::deep_copy(host, t.local_view());
  const gshard::detail::BlockIndex b =
      gshard::detail::block_index(S::layout, t.shape(), mesh.sizes(), mesh.coordinates());
  const FileBlock f = file_block(t, "checksum", "");
  std::uint64_t sum = 0;
  if (f.owner)
    for (std::size_t i = 0; i < host.extent(0); ++i) {
      const std::int64_t g = b.global_of(static_cast<std::int64_t>(i));
      if (g >= 0) sum += element_hash(static_cast<std::uint64_t>(g), host(i));
    }
  const gshard::detail::CollectiveWatch watch("AllReduce (checksum)", "", mesh.comm());
  MPI_Allreduce(MPI_IN_PLACE, &sum, 1, MPI_UINT64_T, MPI_SUM, mesh.comm());
  return sum;
}

/// " (world rank R on HOST)": where a file system error happened, for messages every rank shows.
inline std::string where_here() {
  int rank = 0, length = 0;
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Get_processor_name(host, &length);
  return " (world rank " + std::to_string(rank) + " on " +
         std::string(host, static_cast<std::size_t>(length)) + ")";
}

/// Why this rank cannot create `path` ("" when it can): its directory is missing, on a
/// read-only file system, or not writable here. The processor name (the host) is in the text.
inline std::string cannot_create(const std::string& path) {
#if defined(__unix__)
  const std::filesystem::path p(path);
  const std::string dir = p.has_parent_path() ? p.parent_path().string() : ".";
  if (::access(dir.c_str(), W_OK) == 0) return {};
  return "cannot create " + path + ": " + std::strerror(errno) + where_here();
#else
  (void)path;
  return {};
#endif
}

/// Creates `path` with `bytes` reserved on its file system ("" when done, or when the file system
/// cannot reserve: fallocate unsupported). Reserved first, a full disk fails here, before the
/// collective writes: Open MPI 4.1's OMPIO loses a write's ENOSPC, and MPI_File_sync then fails
/// on one rank while the others wait in it (docs/multihost.md).
inline std::string reserve_file(const std::string& path, std::uint64_t bytes) {
#if defined(__linux__)
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) return "cannot create " + path + ": " + std::strerror(errno) + where_here();
  int err = 0;
  if (bytes > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) err = errno;
  ::close(fd);
  if (err == 0 || err == EOPNOTSUPP || err == ENOSYS) return {};
  ::unlink(path.c_str());
  return "cannot reserve " + std::to_string(bytes) + " bytes for " + path + ": " +
         std::strerror(err) + where_here();
#else
  (void)path;
  (void)bytes;
  return {};
#endif
}

/// Before a collective open for writing `path` (`bytes` long), collective over `comm`: every
/// rank can create it, and rank 0 creates it with its space reserved; else the same Error on
/// every rank. Open MPI 4.1's OMPIO hangs instead of failing where an open fails on some ranks
/// only (a directory read-only on one host), and where a write runs out of space.
inline void prepare_file(MPI_Comm comm, const std::string& path, std::uint64_t bytes,
                         const std::string& op) {
  agree(comm, op, cannot_create(path));
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  agree(comm, op, rank == 0 ? reserve_file(path, bytes) : std::string());
}

}  // namespace detail
}  // namespace gshard::io
