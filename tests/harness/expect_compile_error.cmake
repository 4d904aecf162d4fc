# Builds TARGET in BUILD_DIR and succeeds only if the build FAILS and the compiler's diagnostic
# contains EXPECTED within its first MAX_LINES lines (build-tool chatter not counted).
foreach(var BUILD_DIR TARGET EXPECTED MAX_LINES)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "expect_compile_error.cmake: ${var} is not set")
  endif()
endforeach()
set(config_args)
if(CONFIG)
  set(config_args --config "${CONFIG}")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}" ${config_args}
  RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled, but it must not.\n${out}")
endif()

# Keep the compiler's lines only: drop make/ninja progress and recipe lines.
string(REPLACE ";" "\\;" out_escaped "${out}")
string(REPLACE "\n" ";" lines "${out_escaped}")
set(diagnostic "")
set(count 0)
foreach(line IN LISTS lines)
  if(line MATCHES "^(\\[[ 0-9/%]+\\]|g?make(\\[[0-9]+\\])?:|ninja:|FAILED:|Consolidate compiler|Scanning dependencies|Building CXX|Linking)")
    continue()
  endif()
  if(line MATCHES "^/.*(c\\+\\+|g\\+\\+|clang\\+\\+|mpicxx|nvcc).* -c ")
    continue()  # the compile command line itself
  endif()
  if(count LESS MAX_LINES)
    string(APPEND diagnostic "${line}\n")
  endif()
  math(EXPR count "${count} + 1")
endforeach()

string(FIND "${diagnostic}" "${EXPECTED}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "${TARGET} failed to compile, but its first ${MAX_LINES} lines of diagnostic "
    "do not contain \"${EXPECTED}\":\n${diagnostic}")
endif()
message(STATUS "${TARGET}: rejected as expected with \"${EXPECTED}\"")
