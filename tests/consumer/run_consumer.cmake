# Builds tests/consumer against gshard and runs it on 2 ranks.
#   MODE=FIND_PACKAGE: install gshard from GSHARD_BUILD_DIR to a fresh prefix, then find_package it.
#   MODE=SUBDIRECTORY: add_subdirectory(GSHARD_SOURCE_DIR).
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
set(build "${WORK_DIR}/build")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT result EQUAL 0)
    string(JOIN " " shown ${ARGN})
    message(FATAL_ERROR "failed (${result}): ${shown}\n${out}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

set(configure_args -S "${CMAKE_CURRENT_LIST_DIR}" -B "${build}" -D "MODE=${MODE}"
  -D "CMAKE_CXX_COMPILER=${CXX_COMPILER}" -D CMAKE_BUILD_TYPE=Release)
if(MODE STREQUAL "FIND_PACKAGE")
  run("${CMAKE_COMMAND}" --install "${GSHARD_BUILD_DIR}" --prefix "${prefix}")
  if(NOT EXISTS "${prefix}/include/gshard/gshard.hpp")
    message(FATAL_ERROR "the install did not place include/gshard/gshard.hpp under ${prefix}")
  endif()
  list(APPEND configure_args -D "CMAKE_PREFIX_PATH=${prefix}" -D "EXPECTED_VERSION=${EXPECTED_VERSION}")
else()
  list(APPEND configure_args -D "GSHARD_SOURCE_DIR=${GSHARD_SOURCE_DIR}")
endif()
run("${CMAKE_COMMAND}" ${configure_args})
message(STATUS "${last_output}")
run("${CMAKE_COMMAND}" --build "${build}")

string(REPLACE "|" ";" mpirun "${MPIRUN}")  # the mpirun command for 2 ranks, '|'-separated
run(${mpirun} "${build}/consumer")
message(STATUS "${last_output}")
if(NOT last_output MATCHES "consumer: gshard ${EXPECTED_VERSION}, 2 ranks, sum [0-9]+: ok")
  message(FATAL_ERROR "unexpected consumer output:\n${last_output}")
endif()
