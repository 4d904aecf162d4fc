#pragma once
// Global tensors as NumPy .npy files, written and read collectively with MPI-IO (each rank its
// own block; nothing is gathered). The header is validated before it is trusted (io/format.hpp).
//
//   io::save_npy("w.npy", w);                              // any Sharded without +axis
//   auto v = io::load_npy<Sharded<float, M, "A:x B">>(mesh, "w.npy");
//   io::load_npy_into("w.npy", v);                         // shape and dtype must match
#include <mpi.h>

#include <source_location>
#include <string>

#include "format.hpp"
#include "mpi_file.hpp"

namespace gshard::io {

/// Writes `tensor`'s global value as a C-order .npy file. Collective over its mesh.
template <class S>
void save_npy(const std::string& path, const S& tensor,
              std::source_location where = std::source_location::current()) {
  const gshard::detail::UserSite site(where, "save_npy");
  using T = typename S::value_type;
  const std::string header = make_npy_header(npy_descr<T>(), tensor.shape());
  const std::uint64_t total = header.size() + static_cast<std::uint64_t>(tensor.size()) * sizeof(T);
  detail::prepare_file(tensor.mesh().comm(), path, total, "save_npy");
  detail::MpiFile file(tensor.mesh().comm(), path, MPI_MODE_CREATE | MPI_MODE_WRONLY, "save_npy");
  file.set_size(total);
  file.write_on_root(0, header);
  detail::transfer_block(file, header.size(), tensor, /*write=*/true, path);
  file.sync_and_close();
}

/// The validated header of a .npy file (rank 0 reads it; every rank gets it). Collective.
inline NpyHeader read_npy_header(const detail::MpiFile& file) {
  const std::uint64_t size = file.size();
  const std::string prefix = file.read_on_root(0, std::min<std::uint64_t>(size, 12));
  const std::uint64_t start = npy_header_length(prefix, size, file.path());
  return parse_npy_header(file.read_on_root(0, start), size, file.path());
}

/// Reads a .npy file into `tensor` (any layout without +axis), in place; its dtype and shape
/// must be the tensor's. Collective over the tensor's mesh.
template <class S>
void load_npy_into(const std::string& path, S& tensor,
                   std::source_location where = std::source_location::current()) {
  const gshard::detail::UserSite site(where, "load_npy_into");
  using T = typename S::value_type;
  detail::MpiFile file(tensor.mesh().comm(), path, MPI_MODE_RDONLY, "load_npy");
  const NpyHeader h = read_npy_header(file);
  if (h.dtype.name != npy_descr<T>())
    throw Error("load_npy", path + ": dtype '" + h.dtype.name +
                                "', the tensor it is read into holds '" +
                                std::string(npy_descr<T>()) + "'");
  if (h.shape != tensor.shape())
    throw Error("load_npy", path + ": shape " + detail::shape_text(h.shape) +
                                ", the tensor it is read into (\"" + std::string(S::spec_string()) +
                                "\") has " + detail::shape_text(tensor.shape()));
  detail::transfer_block(file, h.data_start, tensor, /*write=*/false, path);
}

/// A new tensor of layout S on `mesh`, shaped as the file says. Collective.
template <class S>
[[nodiscard]] S load_npy(const typename S::mesh_type& mesh, const std::string& path,
                         std::source_location where = std::source_location::current()) {
  const gshard::detail::UserSite site(where, "load_npy");
  std::vector<std::int64_t> shape;
  {
    detail::MpiFile file(mesh.comm(), path, MPI_MODE_RDONLY, "load_npy");
    shape = read_npy_header(file).shape;
  }
  if (static_cast<int>(shape.size()) != S::rank)
    throw Error("load_npy", path + ": an array of " + std::to_string(shape.size()) +
                                " dimensions, the layout \"" + std::string(S::spec_string()) +
                                "\" has " + std::to_string(S::rank));
  S out(mesh, shape);
  load_npy_into(path, out);
  return out;
}

}  // namespace gshard::io
