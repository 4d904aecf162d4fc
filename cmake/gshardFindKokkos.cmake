# Provides the target Kokkos::kokkos.
#
# A user's own Kokkos (4.x/5.x, any backend) wins when Kokkos_ROOT, Kokkos_DIR or CMAKE_PREFIX_PATH
# points at it. Otherwise we use Debian's copy inside Trilinos (libtrilinos-kokkos-dev, Kokkos 3.4,
# Serial): its KokkosConfig.cmake points at the non-existent /usr/lib/include and forces
# CMAKE_CXX_EXTENSIONS off, so we never load it and build an imported target from the header and
# library instead. Installed with gshard, so consumers find Kokkos the same way.
if(TARGET Kokkos::kokkos)
  return()
endif()

# System prefixes are skipped on purpose: that is where the broken Trilinos config lives.
find_package(Kokkos 3.4 CONFIG QUIET
  NO_CMAKE_SYSTEM_PATH NO_SYSTEM_ENVIRONMENT_PATH
  NO_CMAKE_PACKAGE_REGISTRY NO_CMAKE_SYSTEM_PACKAGE_REGISTRY)
if(Kokkos_FOUND AND TARGET Kokkos::kokkos)
  set(GSHARD_KOKKOS_SOURCE "user (${Kokkos_DIR})")
  return()
endif()

find_path(GSHARD_KOKKOS_INCLUDE_DIR Kokkos_Core.hpp PATH_SUFFIXES trilinos
  DOC "Directory holding Kokkos_Core.hpp (Debian: /usr/include/trilinos)")
find_library(GSHARD_KOKKOS_CORE_LIBRARY NAMES kokkoscore trilinos_kokkoscore
  DOC "The Kokkos core library (Debian: libtrilinos_kokkoscore.so)")
if(NOT GSHARD_KOKKOS_INCLUDE_DIR OR NOT GSHARD_KOKKOS_CORE_LIBRARY)
  set(Kokkos_FOUND FALSE)
  set(_gshard_kokkos_msg "gshard: Kokkos not found. Install Debian's libtrilinos-kokkos-dev "
    "(scripts/install-deps.sh does) or set Kokkos_ROOT to your own Kokkos install.")
  if(gshard_FIND_REQUIRED OR NOT DEFINED gshard_FIND_REQUIRED)
    message(FATAL_ERROR ${_gshard_kokkos_msg})
  endif()
  message(WARNING ${_gshard_kokkos_msg})
  return()
endif()

file(STRINGS "${GSHARD_KOKKOS_INCLUDE_DIR}/KokkosCore_config.h" _gshard_kokkos_version_line
  REGEX "^#define KOKKOS_VERSION [0-9]+")
string(REGEX REPLACE "^#define KOKKOS_VERSION ([0-9]+).*" "\\1" _gshard_kv "${_gshard_kokkos_version_line}")
math(EXPR _gshard_kv_major "${_gshard_kv} / 10000")
math(EXPR _gshard_kv_minor "(${_gshard_kv} / 100) % 100")
math(EXPR _gshard_kv_patch "${_gshard_kv} % 100")
set(Kokkos_VERSION "${_gshard_kv_major}.${_gshard_kv_minor}.${_gshard_kv_patch}")
set(Kokkos_FOUND TRUE)

add_library(Kokkos::kokkos INTERFACE IMPORTED)
set_target_properties(Kokkos::kokkos PROPERTIES
  INTERFACE_INCLUDE_DIRECTORIES "${GSHARD_KOKKOS_INCLUDE_DIR}"
  INTERFACE_LINK_LIBRARIES "${GSHARD_KOKKOS_CORE_LIBRARY};${CMAKE_DL_LIBS}")
set(GSHARD_KOKKOS_SOURCE "Debian Trilinos (${GSHARD_KOKKOS_INCLUDE_DIR})")
