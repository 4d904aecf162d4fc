include_guard(GLOBAL)
# Test registration helpers for gshard's own test suite.
#
#   gshard_add_mpi_test(NAME name SOURCES a.cpp ... [RANKS 1 2 4 8] [TIMEOUT seconds] [LIBRARIES ...]
#                       [DEFINITIONS ...])
#     One doctest executable, registered once per rank count as name.npN. mpirun's own --timeout
#     ends a hung job (every rank, no orphans); CTest's TIMEOUT is a backstop above it.
#
#   gshard_add_compile_fail_test(NAME name SOURCE case.cpp [HARNESS_MUST_REPORT regex])
#     The source must NOT compile, and the compiler's output must contain, within its first
#     GSHARD_COMPILE_FAIL_MAX_LINES lines, the text of the source's "// expect-error: <text>" line.
#     HARNESS_MUST_REPORT (harness self-tests only) inverts it: the check must fail with that text.

set(GSHARD_TEST_RANKS 1 2 4 8 CACHE STRING "Rank counts every distributed test runs at")
set(GSHARD_TEST_TIMEOUT 300 CACHE STRING "Default seconds before a distributed test counts as hung")
set(GSHARD_COMPILE_FAIL_MAX_LINES 20 CACHE STRING "A compile-fail diagnostic must appear within this many lines")

find_package(doctest REQUIRED)

# Variables every mpirun we start needs: running as root (containers, CI), oversubscribed cores
# (8 ranks on 2 cores) without busy-polling, and no CMA single-copy, which sandboxes forbid.
# OpenBLAS: one thread per rank, not one per core in every rank (as scripts/mpi-env.sh).
set(GSHARD_MPI_ENVIRONMENT
  OMPI_ALLOW_RUN_AS_ROOT=1
  OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  OMPI_MCA_mpi_yield_when_idle=1
  OMPI_MCA_btl_vader_single_copy_mechanism=none
  OMPI_MCA_rmaps_base_oversubscribe=1
  OPENBLAS_NUM_THREADS=1)
# A threaded Kokkos backend (OpenMP) runs GSHARD_TEST_THREADS threads per rank, sleeping rather
# than spinning at barriers (ranks outnumber cores); Serial ignores these.
set(GSHARD_TEST_THREADS 2 CACHE STRING "Threads per rank of a threaded Kokkos backend in tests")
list(APPEND GSHARD_MPI_ENVIRONMENT OMP_NUM_THREADS=${GSHARD_TEST_THREADS} OMP_WAIT_POLICY=PASSIVE
  OMP_PROC_BIND=false)

execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version OUTPUT_VARIABLE _gshard_mpiexec_version
  ERROR_VARIABLE _gshard_mpiexec_version)
if(_gshard_mpiexec_version MATCHES "Open MPI|OpenRTE")
  set(GSHARD_MPIEXEC_IS_OPENMPI ON)
else()
  set(GSHARD_MPIEXEC_IS_OPENMPI OFF)
  message(WARNING "gshard tests: ${MPIEXEC_EXECUTABLE} is not Open MPI's; hung tests end only at "
    "CTest's timeout, which may leave ranks behind")
endif()
set(GSHARD_MPIEXEC_PREFLAGS ${MPIEXEC_PREFLAGS})
if(GSHARD_MPIEXEC_IS_OPENMPI)
  list(APPEND GSHARD_MPIEXEC_PREFLAGS --oversubscribe --bind-to none)
endif()

# The doctest main shared by every distributed test: compiled once.
# The doctest run on every rank (test_runner.cpp), and the main() that brings MPI and Kokkos up
# for it; a test playing an application that owns MPI and Kokkos links only the runner (OWN_MAIN).
add_library(gshard_test_runner STATIC "${PROJECT_SOURCE_DIR}/tests/support/test_runner.cpp")
target_link_libraries(gshard_test_runner PUBLIC gshard::gshard doctest::doctest PRIVATE gshard_warnings)
target_include_directories(gshard_test_runner PUBLIC "${PROJECT_SOURCE_DIR}/tests/support")
add_library(gshard_test_main STATIC "${PROJECT_SOURCE_DIR}/tests/support/mpi_test_main.cpp")
target_link_libraries(gshard_test_main PUBLIC gshard_test_runner PRIVATE gshard_warnings)

# Test executables are compile-bound (each runs in seconds; compiling them is most of CI), so in
# optimised builds they take -O1: about half -O3's compile time (grad_index_test: 54 s against
# 100 s). The library's speed is measured in bench/ and examples/, built as configured.
set(GSHARD_TEST_OPTIMIZATION "-O1" CACHE STRING
  "Optimisation flag of test executables in optimised builds (empty: as configured)")
set(_gshard_test_opt "$<$<CONFIG:Release,RelWithDebInfo,MinSizeRel>:${GSHARD_TEST_OPTIMIZATION}>")
target_compile_options(gshard_test_main PRIVATE ${_gshard_test_opt})
target_compile_options(gshard_test_runner PRIVATE ${_gshard_test_opt})
# The few tests whose run time dominates (marked SLOW), and the main job, in Debug builds: the asan
# preset (CI) builds at -O0 for compile time, and sets -O1 here, which runs these 2.7x faster.
# GCC's maybe-uninitialized warnings are false positives under the sanitizers at -O1.
set(GSHARD_SLOW_TEST_OPTIMIZATION "" CACHE STRING
  "Optimisation flag, in Debug builds, of the tests marked SLOW and of the main job")
set(_gshard_slow_opt "")
if(GSHARD_SLOW_TEST_OPTIMIZATION)
  set(_gshard_slow_opt
    "$<$<CONFIG:Debug>:${GSHARD_SLOW_TEST_OPTIMIZATION};-Wno-maybe-uninitialized>")
endif()

# Precompiled headers: every compile-fail case parses gshard.hpp (about 4.5 s each, most of its
# time); a PCH built once cuts that to about 1 s. Tests precompile only mpi_test.hpp (the core:
# meshes, tensors, einsum, elementwise) and parse the op headers they include themselves, so a
# missing include fails here as it does in a device build, which has no PCH. Two PCHs because test
# targets and compile-fail cases build with different flags (warnings); a case that defines
# GSHARD_STRICT itself must parse the library after its #define, so it takes none.
# nvcc (through Kokkos' nvcc_wrapper) cannot use a host compiler's PCH: off under a CUDA Kokkos.
set(_gshard_pch_default ON)
if(Kokkos_ENABLE_CUDA OR CMAKE_CXX_COMPILER MATCHES "nvcc")
  set(_gshard_pch_default OFF)
endif()
option(GSHARD_TEST_PCH "Build gshard's tests with precompiled headers" ${_gshard_pch_default})
if(GSHARD_TEST_PCH)
  add_library(gshard_test_pch OBJECT "${PROJECT_SOURCE_DIR}/tests/support/pch_anchor.cpp")
  target_link_libraries(gshard_test_pch PRIVATE gshard_test_main gshard_warnings)
  target_compile_options(gshard_test_pch PRIVATE ${_gshard_test_opt})  # as the tests using it
  target_precompile_headers(gshard_test_pch PRIVATE <mpi_test.hpp>)
  add_library(gshard_compile_fail_pch OBJECT "${PROJECT_SOURCE_DIR}/tests/support/pch_anchor.cpp")
  target_link_libraries(gshard_compile_fail_pch PRIVATE gshard::gshard)
  target_precompile_headers(gshard_compile_fail_pch PRIVATE <gshard/gshard.hpp>)
endif()

# The mpirun command line for NRANKS ranks with a hang limit of TIMEOUT seconds.
function(gshard_mpirun_command out nranks timeout)
  set(cmd "${MPIEXEC_EXECUTABLE}" ${GSHARD_MPIEXEC_PREFLAGS})
  if(GSHARD_MPIEXEC_IS_OPENMPI)
    list(APPEND cmd --timeout ${timeout})
  endif()
  list(APPEND cmd ${MPIEXEC_NUMPROC_FLAG} ${nranks})
  set(${out} ${cmd} PARENT_SCOPE)
endfunction()

function(gshard_add_mpi_test)
  cmake_parse_arguments(arg "SLOW;OWN_MAIN" "NAME;TIMEOUT"
    "SOURCES;RANKS;LIBRARIES;LABELS;DEFINITIONS" ${ARGN})
  if(NOT arg_RANKS)
    set(arg_RANKS ${GSHARD_TEST_RANKS})
  endif()
  if(NOT arg_TIMEOUT)
    set(arg_TIMEOUT ${GSHARD_TEST_TIMEOUT})
  endif()
  add_executable(${arg_NAME} ${arg_SOURCES})
  set(main gshard_test_main)
  if(arg_OWN_MAIN)  # its main() starts MPI and Kokkos and calls gshard::test::run_doctest
    set(main gshard_test_runner)
  endif()
  target_link_libraries(${arg_NAME} PRIVATE ${main} gshard_warnings ${arg_LIBRARIES})
  target_compile_options(${arg_NAME} PRIVATE ${_gshard_test_opt})
  if(arg_SLOW AND _gshard_slow_opt)
    target_compile_options(${arg_NAME} PRIVATE ${_gshard_slow_opt})  # other flags: no PCH
  endif()
  if(arg_DEFINITIONS)
    target_compile_definitions(${arg_NAME} PRIVATE ${arg_DEFINITIONS})  # its own parse: no PCH
  elseif(GSHARD_TEST_PCH AND NOT (arg_SLOW AND _gshard_slow_opt))
    target_precompile_headers(${arg_NAME} REUSE_FROM gshard_test_pch)
  endif()
  foreach(n IN LISTS arg_RANKS)
    gshard_mpirun_command(mpirun ${n} ${arg_TIMEOUT})
    add_test(NAME ${arg_NAME}.np${n} COMMAND ${mpirun} $<TARGET_FILE:${arg_NAME}>)
    math(EXPR backstop "${arg_TIMEOUT} + 30")
    set_tests_properties(${arg_NAME}.np${n} PROPERTIES
      PROCESSORS ${n}
      TIMEOUT ${backstop}
      LABELS "mpi;np${n};${arg_LABELS}"
      ENVIRONMENT "${GSHARD_MPI_ENVIRONMENT}")
  endforeach()
endfunction()

function(gshard_add_compile_fail_test)
  cmake_parse_arguments(arg "" "NAME;SOURCE;HARNESS_MUST_REPORT" "" ${ARGN})
  get_filename_component(source "${arg_SOURCE}" ABSOLUTE)
  file(STRINGS "${source}" expect_line REGEX "^// expect-error: ")
  if(NOT expect_line)
    message(FATAL_ERROR "${arg_SOURCE}: a compile-fail case needs a '// expect-error: <text>' line")
  endif()
  string(REGEX REPLACE "^// expect-error: " "" expected "${expect_line}")
  # The expectation is read here: editing the case must re-run the configure step.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${source}")
  set(target compile_fail_${arg_NAME})
  add_executable(${target} EXCLUDE_FROM_ALL "${source}")
  target_link_libraries(${target} PRIVATE gshard::gshard)
  file(STRINGS "${source}" defines_strict REGEX "^#define GSHARD_STRICT")
  if(GSHARD_TEST_PCH AND NOT defines_strict)
    target_precompile_headers(${target} REUSE_FROM gshard_compile_fail_pch)
  endif()
  set(check "${CMAKE_COMMAND}"
    -D "BUILD_DIR=${PROJECT_BINARY_DIR}"
    -D "TARGET=${target}"
    -D "CONFIG=$<CONFIG>"
    -D "EXPECTED=${expected}"
    -D "MAX_LINES=${GSHARD_COMPILE_FAIL_MAX_LINES}"
    -P "${PROJECT_SOURCE_DIR}/tests/harness/expect_compile_error.cmake")
  if(arg_HARNESS_MUST_REPORT)
    # A harness self-test: the check itself must fail, saying HARNESS_MUST_REPORT.
    string(JOIN "|" check ${check})
    set(check "${CMAKE_COMMAND}" -D "COMMAND=${check}" -D "EXPECT=${arg_HARNESS_MUST_REPORT}"
      -D MAX_SECONDS=300 -P "${PROJECT_SOURCE_DIR}/tests/harness/expect_failure.cmake")
  endif()
  add_test(NAME compile_fail.${arg_NAME} COMMAND ${check})
  # One build-tool invocation at a time in the shared build tree.
  set_tests_properties(compile_fail.${arg_NAME} PROPERTIES
    LABELS compile_fail RESOURCE_LOCK gshard_build_tree TIMEOUT 300)
endfunction()
