# gshard::hdf5: what a program that includes gshard/io/hdf5.hpp links (a parallel HDF5; Debian:
# libhdf5-openmpi-dev). Optional: without a parallel HDF5 the target does not exist and only
# io/hdf5.hpp is unavailable. FindHDF5 compiles a C probe, hence the C language.
if(NOT TARGET gshard::hdf5)
  include(CheckLanguage)
  check_language(C)
  if(CMAKE_C_COMPILER)
    enable_language(C)
    set(HDF5_PREFER_PARALLEL TRUE)
    find_package(HDF5 QUIET COMPONENTS C)
    if(HDF5_FOUND AND HDF5_IS_PARALLEL AND TARGET HDF5::HDF5)
      add_library(gshard::hdf5 INTERFACE IMPORTED)
      target_link_libraries(gshard::hdf5 INTERFACE HDF5::HDF5)
    endif()
  endif()
endif()
