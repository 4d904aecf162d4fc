# Provides gshard::cblas: OpenBLAS through its CBLAS interface, for the host GEMMs of
# kernels/contract.hpp (float and double). Defines nothing when OpenBLAS is not found; the caller
# decides whether that is an error. Installed with gshard, so consumers find it the same way.
#
# OpenBLAS rather than any libblas: it picks its kernels for the CPU at run time (Eigen here is
# compiled without -march), while the netlib reference BLAS is an unoptimised loop.
if(TARGET gshard::cblas)
  return()
endif()

# OpenBLAS's own install and Debian's package ship OpenBLASConfig.cmake (variables, no target):
# it names the variant (pthread, openmp, serial) whose header and library belong together.
find_package(OpenBLAS CONFIG QUIET)
set(_gshard_openblas_lib_dirs "")
foreach(_lib IN LISTS OpenBLAS_LIBRARIES)
  get_filename_component(_dir "${_lib}" DIRECTORY)
  list(APPEND _gshard_openblas_lib_dirs "${_dir}")
endforeach()
find_path(GSHARD_CBLAS_INCLUDE_DIR cblas.h
  HINTS ${OpenBLAS_INCLUDE_DIRS}
  PATH_SUFFIXES openblas openblas-pthread openblas-openmp openblas-serial
  DOC "Directory holding OpenBLAS's cblas.h (Debian: /usr/include/x86_64-linux-gnu/openblas-pthread)")
find_library(GSHARD_CBLAS_LIBRARY NAMES openblas
  HINTS ${_gshard_openblas_lib_dirs}
  PATH_SUFFIXES openblas-pthread openblas-openmp openblas-serial
  DOC "The OpenBLAS library (Debian: libopenblas.so from libopenblas-dev)")
if(NOT GSHARD_CBLAS_INCLUDE_DIR OR NOT GSHARD_CBLAS_LIBRARY)
  return()
endif()

add_library(gshard::cblas INTERFACE IMPORTED)
set_target_properties(gshard::cblas PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${GSHARD_CBLAS_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${GSHARD_CBLAS_LIBRARY}")
