#pragma once
// Global tensors as HDF5 datasets, read and written collectively with parallel HDF5 (MPI-IO
// underneath): each rank selects its own block as a hyperslab, nothing is gathered to one rank.
// Loading works on any mesh and layout, so a dataset reshards on load, as a safetensors file does.
//
//   io::save_hdf5("out.h5", "fields/u", u);                 // creates the file and the groups
//   auto v = io::load_hdf5<Sharded<double, M, "I:x J:y">>(mesh, "in.h5", "fields/u");
//   io::load_hdf5_into("in.h5", "fields/u", v);            // into an existing tensor
//
// Needs a parallel HDF5 (Debian: libhdf5-openmpi-dev); link the CMake target gshard::hdf5. Not
// part of io.hpp for that reason. Every failure (missing file or dataset, another rank, shape or
// element type, a dataset already there) throws the same gshard::Error on every rank, and a
// failed save writes nothing: the checks come before the first write, and a file the save
// created is removed again.
#include <hdf5.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include "../comm/agree.hpp"
#include "../tensor/adopt.hpp"
#include "../tensor/sharded.hpp"
#include "format.hpp"

#if !defined(H5_HAVE_PARALLEL)
#error "gshard/io/hdf5.hpp needs a parallel HDF5 (Debian: libhdf5-openmpi-dev; CMake: gshard::hdf5)"
#endif

namespace gshard::io {

/// What save_hdf5 may do to a file that already has the dataset.
struct Hdf5SaveOptions {
  /// Overwrite an existing dataset of the same shape and element type (else: an error).
  bool overwrite = false;
};

namespace detail {

/// An HDF5 identifier closed on scope exit.
class H5Id {
 public:
  H5Id() = default;
  H5Id(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Id(const H5Id&) = delete;
  H5Id& operator=(const H5Id&) = delete;
  H5Id(H5Id&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  H5Id& operator=(H5Id&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  ~H5Id() { reset(); }
  /// Gives up ownership (the caller closes it).
  hid_t release() {
    const hid_t id = id_;
    id_ = H5I_INVALID_HID;
    return id;
  }
  void reset() {
    if (id_ >= 0 && close_ != nullptr) {
      H5E_BEGIN_TRY { close_(id_); }
      H5E_END_TRY;
    }
    id_ = H5I_INVALID_HID;
  }
  [[nodiscard]] hid_t get() const { return id_; }
  [[nodiscard]] bool ok() const { return id_ >= 0; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  herr_t (*close_)(hid_t) = nullptr;
};

/// The innermost message of HDF5's error stack (what went wrong, in HDF5's words).
inline std::string h5_error_text() {
  std::string text;
  H5Ewalk2(
      H5E_DEFAULT, H5E_WALK_DOWNWARD,
      [](unsigned, const H5E_error2_t* e, void* out) -> herr_t {
        if (e != nullptr && e->desc != nullptr && *e->desc != '\0')
          *static_cast<std::string*>(out) = e->desc;
        return 0;
      },
      &text);
  return text.empty() ? std::string("HDF5 reports an error") : text;
}

template <class T>
hid_t h5_native_type() {
  if constexpr (std::is_same_v<T, float>) return H5T_NATIVE_FLOAT;
  if constexpr (std::is_same_v<T, double>) return H5T_NATIVE_DOUBLE;
  if constexpr (std::is_same_v<T, std::int32_t>) return H5T_NATIVE_INT32;
  if constexpr (std::is_same_v<T, std::int64_t>) return H5T_NATIVE_INT64;
}

template <class T>
std::string_view element_name() {
  if constexpr (std::is_same_v<T, float>) return "float32";
  if constexpr (std::is_same_v<T, double>) return "float64";
  if constexpr (std::is_same_v<T, std::int32_t>) return "int32";
  if constexpr (std::is_same_v<T, std::int64_t>) return "int64";
}

/// "float64", "uint8", "string", ...: a dataset's element type as the error messages name it.
inline std::string h5_type_name(hid_t type) {
  const H5T_class_t c = H5Tget_class(type);
  const std::string bits = std::to_string(8 * H5Tget_size(type));
  switch (c) {
    case H5T_FLOAT:
      return "float" + bits;
    case H5T_INTEGER:
      return (H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + bits;
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM:
      return "enum";
    case H5T_ARRAY:
      return "array";
    default:
      return "an HDF5 type of class " + std::to_string(static_cast<int>(c));
  }
}

/// Whether a dataset's element type is T (any byte order: HDF5 converts that on the way).
template <class T>
bool h5_type_is(hid_t type) {
  const H5T_class_t c = H5Tget_class(type);
  if (H5Tget_size(type) != sizeof(T)) return false;
  if constexpr (std::is_floating_point_v<T>) {
    return c == H5T_FLOAT;
  } else {
    return c == H5T_INTEGER && H5Tget_sign(type) == H5T_SGN_2;
  }
}

/// "/a/b" -> "a/b"; an empty name, "." or ".." pieces or empty pieces are refused (empty result).
inline std::string dataset_path(std::string_view name) {
  std::string out;
  std::size_t i = name.starts_with('/') ? 1 : 0;
  if (i == name.size()) return {};
  while (i <= name.size()) {
    const std::size_t j = std::min(name.find('/', i), name.size());
    const std::string_view piece = name.substr(i, j - i);
    if (piece.empty() || piece == "." || piece == "..") return {};
    out.append(out.empty() ? "" : "/").append(piece);
    i = j + 1;
  }
  return out;
}

/// Whether every link along `path` exists and the last is a dataset; else what is missing.
inline std::string find_dataset(hid_t file, const std::string& path, const std::string& where) {
  std::size_t at = 0;
  while (true) {
    const std::size_t slash = path.find('/', at);
    const std::string prefix = path.substr(0, slash);
    htri_t exists = -1;
    H5E_BEGIN_TRY { exists = H5Lexists(file, prefix.c_str(), H5P_DEFAULT); }
    H5E_END_TRY;
    if (exists <= 0) {
      // Name what the parent holds, so a typo is easy to see.
      const std::string parent = prefix.rfind('/') == std::string::npos
                                     ? std::string("/")
                                     : prefix.substr(0, prefix.rfind('/'));
      std::string names;
      H5E_BEGIN_TRY {
#if H5_VERSION_GE(1, 12, 0)
        H5Literate_by_name2(
            file, parent.c_str(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
            [](hid_t, const char* n, const H5L_info2_t*, void* out) -> herr_t {
#else
        H5Literate_by_name(
            file, parent.c_str(), H5_INDEX_NAME, H5_ITER_INC, nullptr,
            [](hid_t, const char* n, const H5L_info_t*, void* out) -> herr_t {
#endif
              auto& s = *static_cast<std::string*>(out);
              s.append(s.empty() ? "" : ", ").append(n);
              return 0;
            },
            &names, H5P_DEFAULT);
      }
      H5E_END_TRY;
      return where + " has no \"/" + prefix + "\" (\"" + (parent == "/" ? "" : "/") + parent +
             "\" holds: " + (names.empty() ? std::string("nothing") : names) + ")";
    }
    if (slash == std::string::npos) break;
    at = slash + 1;
  }
  H5I_type_t type = H5I_BADID;
  H5E_BEGIN_TRY {
    const H5Id object(H5Oopen(file, path.c_str(), H5P_DEFAULT), H5Oclose);
    if (object.ok()) type = H5Iget_type(object.get());
  }
  H5E_END_TRY;
  if (type != H5I_DATASET)
    return where + ": \"/" + path + "\" is not a dataset (a group or a named type)";
  return {};
}

/// Collective over `comm`: rank 0 looks at `path` and every rank learns: 0 no such file, 1 an
/// HDF5 file, 2 something else.
inline int file_kind(MPI_Comm comm, const std::string& path) {
  int kind = 0;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  if (rank == 0) {
    std::error_code ec;
    if (std::filesystem::exists(path, ec)) {
      htri_t is = -1;
      H5E_BEGIN_TRY { is = H5Fis_hdf5(path.c_str()); }
      H5E_END_TRY;
      kind = is > 0 ? 1 : 2;
    }
  }
  const gshard::detail::CollectiveWatch watch("Bcast", "", comm);
  MPI_Bcast(&kind, 1, MPI_INT, 0, comm);
  return kind;
}

/// A file opened (or created) by every rank of `comm` for parallel I/O. Throws the same Error on
/// every rank when that fails.
inline H5Id open_file(MPI_Comm comm, const std::string& path, bool create, bool write,
                      const std::string& op) {
  const H5Id fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  hid_t id = H5I_INVALID_HID;
  std::string error;
  H5E_BEGIN_TRY {
    id = create ? H5Fcreate(path.c_str(), H5F_ACC_EXCL, H5P_DEFAULT, fapl.get())
                : H5Fopen(path.c_str(), write ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get());
    if (id < 0)
      error = "cannot " + std::string(create ? "create " : "open ") + path + ": " + h5_error_text();
  }
  H5E_END_TRY;
  H5Id file(id, H5Fclose);
  const std::string e = gshard::detail::first_message(comm, error);
  if (!e.empty()) {
    file.reset();
    throw Error(op, e);
  }
  return file;
}

/// The file and memory selections of this rank's block: its valid block at its offset in the
/// dataset, inside the padded local block in memory. Nothing selected where `active` is false.
struct H5Block {
  H5Id file_space, memory_space;
};

template <class S>
H5Block select_block(const S& t, bool writing) {
  const auto& mesh = t.mesh();
  const int rank = S::rank;
  const LocalBlock b = local_block<S>(mesh, t.shape());
  const std::vector<hsize_t> global(t.shape().begin(), t.shape().end());
  const std::vector<hsize_t> padded(b.padded.begin(), b.padded.end());
  const std::vector<hsize_t> valid(b.extents.begin(), b.extents.end());
  std::vector<hsize_t> offset;
  for (int d = 0; d < rank; ++d)
    offset.push_back(static_cast<hsize_t>(
        std::min(b.offsets[static_cast<std::size_t>(d)], t.shape()[static_cast<std::size_t>(d)])));
  const std::int64_t elements = gshard::detail::product(b.extents);
  // One copy writes; all read.
  const bool owner =
      gshard::detail::writes_block(S::layout, mesh.coordinates(), S::mesh_type::axis_count);
  H5Block out;
  if (rank == 0) {
    out.file_space = H5Id(H5Screate(H5S_SCALAR), H5Sclose);
    out.memory_space = H5Id(H5Screate(H5S_SCALAR), H5Sclose);
  } else {
    out.file_space = H5Id(H5Screate_simple(rank, global.data(), nullptr), H5Sclose);
    out.memory_space = H5Id(H5Screate_simple(rank, padded.data(), nullptr), H5Sclose);
  }
  const bool active = elements > 0 && (owner || !writing);
  if (!active) {
    H5Sselect_none(out.file_space.get());
    H5Sselect_none(out.memory_space.get());
  } else if (rank > 0) {
    const std::vector<hsize_t> zeros(static_cast<std::size_t>(rank), 0);
    H5Sselect_hyperslab(out.file_space.get(), H5S_SELECT_SET, offset.data(), nullptr, valid.data(),
                        nullptr);
    H5Sselect_hyperslab(out.memory_space.get(), H5S_SELECT_SET, zeros.data(), nullptr, valid.data(),
                        nullptr);
  }
  return out;
}

/// Checks an open dataset against the tensor it is read into (or overwritten from): element type
/// and global shape. Empty when they match, else why not.
template <class S>
std::string check_dataset(hid_t dataset, const Shape* shape, const std::string& what,
                          Shape* found = nullptr) {
  using T = typename S::value_type;
  const H5Id type(H5Dget_type(dataset), H5Tclose);
  if (!h5_type_is<T>(type.get()))
    return what + " holds " + h5_type_name(type.get()) + ", the tensor is " +
           std::string(element_name<T>());
  const H5Id space(H5Dget_space(dataset), H5Sclose);
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  if (ndims < 0 || H5Sget_simple_extent_type(space.get()) == H5S_NULL)
    return what + " has no dataspace (an empty attribute-like dataset)";
  std::vector<hsize_t> dims(static_cast<std::size_t>(ndims));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  Shape file_shape(dims.begin(), dims.end());
  if (ndims != S::rank)
    return what + " has " + std::to_string(ndims) + " dimensions " + shape_text(file_shape) +
           ", the layout \"" + std::string(S::spec_string()) + "\" has " + std::to_string(S::rank);
  if (shape != nullptr && *shape != file_shape)
    return what + " has shape " + shape_text(file_shape) + ", the tensor (\"" +
           std::string(S::spec_string()) + "\") has " + shape_text(*shape);
  if (found != nullptr) *found = file_shape;
  return {};
}

/// Reads `dataset` of `path` into `t` (shape and type checked when `t` has a shape), or, when
/// `make` is set, makes `t` of the dataset's shape on `mesh` first. Collective.
template <class S>
void read_dataset(const typename S::mesh_type& mesh, const std::string& path, std::string_view name,
                  S* t, bool make) {
  using T = typename S::value_type;
  const std::string op = "load_hdf5";
  MPI_Comm comm = mesh.comm();
  const std::string dataset = dataset_path(name);
  gshard::detail::agree(
      comm, op,
      dataset.empty() ? "\"" + std::string(name) + "\" is not a dataset name (\"a\" or \"group/a\")"
                      : std::string());
  const int kind = file_kind(comm, path);
  gshard::detail::agree(comm, op,
                        kind == 0   ? "no file " + path
                        : kind == 2 ? path + " is not an HDF5 file"
                                    : std::string());
  const H5Id file = open_file(comm, path, /*create=*/false, /*write=*/false, op);
  gshard::detail::agree(comm, op, find_dataset(file.get(), dataset, path));
  H5Id set;
  H5E_BEGIN_TRY { set = H5Id(H5Dopen2(file.get(), dataset.c_str(), H5P_DEFAULT), H5Dclose); }
  H5E_END_TRY;
  gshard::detail::agree(
      comm, op,
      set.ok() ? std::string()
               : "cannot open dataset \"/" + dataset + "\" of " + path + ": " + h5_error_text());
  const std::string what = path + ": dataset \"/" + dataset + "\"";
  Shape shape;
  gshard::detail::agree(comm, op,
                        check_dataset<S>(set.get(), make ? nullptr : &t->shape(), what, &shape));
  if (make) *t = S(mesh, shape);
  const H5Block block = select_block(*t, /*writing=*/false);
  auto host = Kokkos::create_mirror_view(t->local_view());
  const H5Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
  herr_t rc = -1;
  std::string error;
  H5E_BEGIN_TRY {
    rc = t->size() == 0 ? 0  // no storage to read from
                        : H5Dread(set.get(), h5_native_type<T>(), block.memory_space.get(),
                                  block.file_space.get(), dxpl.get(), host.data());
    if (rc < 0) error = "cannot read " + what + ": " + h5_error_text();
  }
  H5E_END_TRY;
  gshard::detail::agree(comm, op, error);
  Kokkos::deep_copy(t->local_view(), host);
  gshard::detail::mark_updated(*t, "load_hdf5");
}

}  // namespace detail

/// The dataset `dataset` of the HDF5 file `path` as a new tensor of layout S on `mesh`, shaped as
/// the file says (any mesh and layout without pending partial sums: the data reshards on load).
/// The dataset's element type must be S's (any byte order). Collective over the mesh.
template <class S>
[[nodiscard]] S load_hdf5(const typename S::mesh_type& mesh, const std::string& path,
                          std::string_view dataset,
                          std::source_location where = std::source_location::current()) {
  static_assert(S::layout.partial_count == 0,
                "gshard::io::load_hdf5: a layout with pending partial sums (+axis) holds no "
                "value; load into a layout without +axis");
  const gshard::detail::UserSite site(where, "load_hdf5");
  S out(mesh, Shape(static_cast<std::size_t>(S::rank), 0));
  detail::read_dataset<S>(mesh, path, dataset, &out, /*make=*/true);
  return out;
}

/// Reads the dataset into an existing tensor (its global shape must be the dataset's), in place.
/// Collective over the tensor's mesh.
template <class S>
void load_hdf5_into(const std::string& path, std::string_view dataset, S& tensor,
                    std::source_location where = std::source_location::current()) {
  static_assert(S::layout.partial_count == 0,
                "gshard::io::load_hdf5_into: a layout with pending partial sums (+axis) holds no "
                "value; load into a layout without +axis");
  const gshard::detail::UserSite site(where, "load_hdf5_into");
  detail::read_dataset<S>(tensor.mesh(), path, dataset, &tensor, /*make=*/false);
}

/// Writes `tensor`'s global value as the dataset `dataset` (groups on its path are created) of
/// the HDF5 file `path`, created when missing. Each rank writes its own block (one copy of
/// replicated blocks writes). An existing dataset is an error unless options.overwrite and it
/// has the same shape and element type. Collective over the tensor's mesh; on failure nothing is
/// written.
template <class S>
void save_hdf5(const std::string& path, std::string_view dataset, const S& tensor,
               Hdf5SaveOptions options = {},
               std::source_location where = std::source_location::current()) {
  static_assert(S::layout.partial_count == 0,
                "gshard::io::save_hdf5: a tensor with pending partial sums (+axis) has no value to "
                "save; reshard it to a layout without +axis first");
  using T = typename S::value_type;
  const gshard::detail::UserSite site(where, "save_hdf5");
  const std::string op = "save_hdf5";
  MPI_Comm comm = tensor.mesh().comm();
  const std::string name = detail::dataset_path(dataset);
  gshard::detail::agree(
      comm, op,
      name.empty() ? "\"" + std::string(dataset) + "\" is not a dataset name (\"a\" or \"group/a\")"
                   : std::string());
  const int kind = detail::file_kind(comm, path);
  gshard::detail::agree(comm, op,
                        kind == 2 ? path + " exists and is not an HDF5 file" : std::string());
  const bool created = kind == 0;
  const std::string what = path + ": dataset \"/" + name + "\"";
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  // A file this call created goes again when a later step fails.
  auto fail_cleanly = [&](detail::H5Id& file, const std::string& error) {
    const std::string e = gshard::detail::first_message(comm, error);
    if (e.empty()) return;
    file.reset();
    if (created && rank == 0) {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
    const gshard::detail::CollectiveWatch watch("Barrier", "", comm);
    MPI_Barrier(comm);
    throw Error(op, e);
  };
  detail::H5Id file = detail::open_file(comm, path, created, /*write=*/true, op);
  detail::H5Id set;
  {
    htri_t exists = 0;
    if (!created) exists = detail::find_dataset(file.get(), name, path).empty() ? 1 : 0;
    std::string error;
    if (exists > 0 && !options.overwrite) {
      error = what + " exists (Hdf5SaveOptions{.overwrite = true} replaces it)";
    } else if (exists > 0) {
      H5E_BEGIN_TRY {
        set = detail::H5Id(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
      }
      H5E_END_TRY;
      error = set.ok() ? detail::check_dataset<S>(set.get(), &tensor.shape(), what)
                       : "cannot open " + what + ": " + detail::h5_error_text();
    }
    fail_cleanly(file, error);
  }
  const detail::H5Block block = detail::select_block(tensor, /*writing=*/true);
  if (!set.ok()) {
    const detail::H5Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    std::string error;
    H5E_BEGIN_TRY {
      // The dataspace of the global shape (its selection does not matter for creation).
      set = detail::H5Id(H5Dcreate2(file.get(), name.c_str(), detail::h5_native_type<T>(),
                                    block.file_space.get(), lcpl.get(), H5P_DEFAULT, H5P_DEFAULT),
                         H5Dclose);
      if (!set.ok()) error = "cannot create " + what + ": " + detail::h5_error_text();
    }
    H5E_END_TRY;
    fail_cleanly(file, error);
  }
  auto host = Kokkos::create_mirror_view(tensor.local_view());
  Kokkos::deep_copy(host, tensor.local_view());
  const detail::H5Id dxpl(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(dxpl.get(), H5FD_MPIO_COLLECTIVE);
  std::string error;
  // An empty dataset has no storage to write to (parallel HDF5 refuses even an empty write).
  H5E_BEGIN_TRY {
    if (tensor.size() > 0 &&
        H5Dwrite(set.get(), detail::h5_native_type<T>(), block.memory_space.get(),
                 block.file_space.get(), dxpl.get(), host.data()) < 0)
      error = "cannot write " + what + ": " + detail::h5_error_text();
  }
  H5E_END_TRY;
  set.reset();
  fail_cleanly(file, error);
  herr_t closed = -1;
  H5E_BEGIN_TRY { closed = H5Fclose(file.release()); }
  H5E_END_TRY;
  gshard::detail::agree(
      comm, op,
      closed < 0 ? "cannot close " + path + ": " + detail::h5_error_text() : std::string());
}

}  // namespace gshard::io
