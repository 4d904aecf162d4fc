#pragma once
// Checkpoints as standard safetensors files, written and read collectively with MPI-IO: every
// rank writes or reads only its own block of each global tensor (io/mpi_file.hpp). Loading works
// on any mesh and layout, so a checkpoint reshards on load.
//
//   io::SafetensorsWriter w(mesh.comm());
//   w.add("wi", wi);                       // any Sharded, by handle; written as its global value
//   w.set_metadata("step", "100");
//   w.write("ckpt/model.safetensors");     // collective and atomic
//
//   io::SafetensorsReader r(mesh.comm(), "ckpt/model.safetensors");   // validates the header
//   r.read_into("wi", wi);                 // checks dtype and shape, verifies the checksum
//   auto b = r.read<Sharded<float, M, "A B:x">>(mesh, "b");
//
// Atomic: the file is written under `path + ".tmp"`, flushed, closed and renamed over `path`, so
// a crash during a save leaves the previous file whole. Each tensor's checksum (io::element_hash
// summed over its elements) goes into the metadata as "gshard.checksum.<name>" and is verified on
// load when present (files written elsewhere may lack it).
#include <mpi.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <source_location>
#include <string>
#include <vector>

#include "format.hpp"
#include "mpi_file.hpp"

#if defined(__unix__)
#include <fcntl.h>
#include <unistd.h>
#endif

namespace gshard::io {

inline constexpr std::string_view checksum_key_prefix = "gshard.checksum.";

namespace detail {

inline std::string hex64(std::uint64_t v) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
  return text;
}

/// Throws (the same on every rank: the comparison is) unless the tensor's mesh spans `comm`.
inline void check_same_ranks(MPI_Comm comm, MPI_Comm mesh_comm, const std::string& op,
                             const std::string& name) {
  int result = MPI_UNEQUAL;
  MPI_Comm_compare(comm, mesh_comm, &result);
  int bad = result == MPI_UNEQUAL ? 1 : 0;
  const gshard::detail::CollectiveWatch watch("AllReduce", "", comm);
  MPI_Allreduce(MPI_IN_PLACE, &bad, 1, MPI_INT, MPI_MAX, comm);
  if (bad)
    throw Error(
        op, "tensor \"" + name + "\": its mesh is over other ranks than the file's communicator");
}

/// fsync of the directory holding `path`, so a rename survives a crash of the machine.
inline void sync_directory(const std::filesystem::path& path) {
#if defined(__unix__)
  const std::string dir = path.has_parent_path() ? path.parent_path().string() : ".";
  const int fd = ::open(dir.c_str(), O_RDONLY);
  if (fd >= 0) {
    (void)::fsync(fd);
    ::close(fd);
  }
#else
  (void)path;
#endif
}

}  // namespace detail

/// Collects named global tensors and metadata, then writes them as one safetensors file.
class SafetensorsWriter {
 public:
  explicit SafetensorsWriter(MPI_Comm comm) : comm_(comm) {}

  /// Adds a tensor (kept by handle until write()). Names are unique; "__metadata__" is reserved.
  template <class S>
  void add(std::string name, const S& tensor) {
    using T = typename S::value_type;
    static_assert(S::layout.partial_count == 0,
                  "gshard::io: a tensor with pending partial sums (+axis) has no value to save; "
                  "reshard it to a layout without +axis first");
    SafetensorsEntry e;
    e.name = name;
    e.dtype = {std::string(safetensors_dtype<T>()), sizeof(T)};
    e.shape = tensor.shape();
    Item item;
    item.entry = std::move(e);
    item.checksum = [tensor] { return detail::checksum(tensor); };
    item.write = [tensor, name](const detail::MpiFile& f, std::uint64_t at) {
      detail::transfer_block(f, at, tensor, /*write=*/true, name);
    };
    item.mesh_comm = tensor.mesh().comm();
    items_.push_back(std::move(item));
  }

  void set_metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }

  /// Writes every tensor added, collectively over the communicator, atomically (temporary name,
  /// flush, rename). Throws the same gshard::Error on every rank on failure; `path` is then
  /// unchanged.
  void write(const std::string& path,
             std::source_location where = std::source_location::current()) const {
    const gshard::detail::UserSite site(where, "SafetensorsWriter::write");
    const std::string op = "write_safetensors";
    std::map<std::string, std::string> metadata = metadata_;
    std::vector<SafetensorsEntry> entries;
    for (const auto& item : items_) {
      detail::check_same_ranks(comm_, item.mesh_comm, op, item.entry.name);
      metadata[std::string(checksum_key_prefix) + item.entry.name] = detail::hex64(item.checksum());
      entries.push_back(item.entry);
    }
    // Identical on every rank: shapes, names and checksums are.
    const std::string header = make_safetensors_header(entries, metadata);
    const std::uint64_t total = header.size() + (entries.empty() ? 0 : entries.back().end);
    const std::string tmp = path + ".tmp";
    int rank = 0;
    MPI_Comm_rank(comm_, &rank);
    detail::prepare_file(comm_, tmp, total, op);  // a crashed save's leftovers replaced
    const gshard::detail::CollectiveWatch watch("Barrier", "", comm_);
    MPI_Barrier(comm_);
    {
      detail::MpiFile file(comm_, tmp, MPI_MODE_CREATE | MPI_MODE_WRONLY, op);
      file.set_size(total);
      file.write_on_root(0, header);
      for (std::size_t i = 0; i < items_.size(); ++i)
        items_[i].write(file, header.size() + entries[i].begin);
      file.sync_and_close();
    }
    std::string error;
    if (rank == 0) {
      std::error_code ec;
      std::filesystem::rename(tmp, path, ec);
      if (ec)
        error = "cannot rename " + tmp + " to " + path + ": " + ec.message();
      else
        detail::sync_directory(path);
    }
    detail::agree(comm_, op, error);
  }

 private:
  struct Item {
    SafetensorsEntry entry;
    std::function<std::uint64_t()> checksum;
    std::function<void(const detail::MpiFile&, std::uint64_t)> write;
    MPI_Comm mesh_comm = MPI_COMM_NULL;
  };
  MPI_Comm comm_;
  std::vector<Item> items_;
  std::map<std::string, std::string> metadata_;
};

/// A safetensors file opened by every rank of a communicator; its header is read by rank 0,
/// broadcast, and validated (io/format.hpp) before anything else happens.
class SafetensorsReader {
 public:
  SafetensorsReader(MPI_Comm comm, std::string path,
                    std::source_location where = std::source_location::current())
      : site_(where),
        comm_(comm),
        path_(std::move(path)),
        file_(std::make_unique<detail::MpiFile>(comm, path_, MPI_MODE_RDONLY, "read_safetensors")) {
    const std::uint64_t size = file_->size();
    const std::string first = file_->read_on_root(0, std::min<std::uint64_t>(size, 8));
    const std::uint64_t n = safetensors_header_length(first, size, path_);
    const std::string json = file_->read_on_root(8, n);
    header_ = parse_safetensors_header(json, size, path_);
    site_.reset();
  }

  [[nodiscard]] const SafetensorsHeader& header() const { return header_; }
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const {
    return header_.metadata;
  }
  [[nodiscard]] bool contains(std::string_view name) const { return header_.find(name) != nullptr; }
  /// A metadata value; throws when the file lacks the key.
  [[nodiscard]] const std::string& metadata(const std::string& key) const {
    const auto it = header_.metadata.find(key);
    if (it == header_.metadata.end())
      throw Error("read_safetensors", path_ + ": no metadata \"" + key + "\"");
    return it->second;
  }
  /// The global shape of a tensor in the file.
  [[nodiscard]] const std::vector<std::int64_t>& shape(std::string_view name) const {
    return entry(name).shape;
  }

  /// Reads the tensor `name` into `tensor` (any mesh, any layout without +axis), in place.
  /// Checks dtype and global shape; verifies the checksum when the file has one. Collective.
  template <class S>
  void read_into(std::string_view name, S& tensor,
                 std::source_location where = std::source_location::current()) const {
    const gshard::detail::UserSite site(where, "SafetensorsReader::read_into");
    using T = typename S::value_type;
    const std::string op = "read_safetensors";
    const SafetensorsEntry& e = entry(name);
    const std::string what = path_ + ": tensor \"" + e.name + "\"";
    if (e.dtype.name != safetensors_dtype<T>())
      throw Error(op, what + " is " + e.dtype.name + ", the tensor it is read into is " +
                          std::string(safetensors_dtype<T>()));
    if (e.shape != tensor.shape())
      throw Error(op, what + " has shape " + io::detail::shape_text(e.shape) +
                          ", the tensor it is read into (\"" + std::string(S::spec_string()) +
                          "\") has " + io::detail::shape_text(tensor.shape()));
    detail::check_same_ranks(comm_, tensor.mesh().comm(), op, e.name);
    detail::transfer_block(*file_, header_.data_start() + e.begin, tensor, /*write=*/false, e.name);
    const auto it = header_.metadata.find(std::string(checksum_key_prefix) + e.name);
    if (it == header_.metadata.end()) return;
    const std::string got = detail::hex64(detail::checksum(tensor));
    if (got != it->second)
      throw Error(op, what + ": checksum " + got + " differs from the recorded " + it->second +
                          " (the file is corrupt)");
  }

  /// A new tensor of layout S on `mesh`, shaped as the file says, holding the tensor `name`.
  template <class S>
  [[nodiscard]] S read(const typename S::mesh_type& mesh, std::string_view name,
                       std::source_location where = std::source_location::current()) const {
    const gshard::detail::UserSite site(where, "SafetensorsReader::read");
    const auto& e = entry(name);
    if (static_cast<int>(e.shape.size()) != S::rank)
      throw Error("read_safetensors",
                  path_ + ": tensor \"" + e.name + "\" has " + std::to_string(e.shape.size()) +
                      " dimensions, the layout \"" + std::string(S::spec_string()) + "\" has " +
                      std::to_string(S::rank));
    S out(mesh, e.shape);
    read_into(name, out);
    return out;
  }

 private:
  const SafetensorsEntry& entry(std::string_view name) const {
    const SafetensorsEntry* e = header_.find(name);
    if (e == nullptr) {
      std::string names;
      for (const auto& t : header_.tensors) names.append(names.empty() ? "" : ", ").append(t.name);
      throw Error("read_safetensors",
                  path_ + ": no tensor \"" + std::string(name) +
                      "\" (it holds: " + (names.empty() ? std::string("none") : names) + ")");
    }
    return *e;
  }

  // The caller's line while the constructor runs (members are made before its body).
  std::optional<gshard::detail::UserSite> site_;
  MPI_Comm comm_;
  std::string path_;
  std::unique_ptr<detail::MpiFile> file_;
  SafetensorsHeader header_;
};

}  // namespace gshard::io
