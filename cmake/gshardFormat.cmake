# format-check: fails when a source of ours differs from .clang-format; format: rewrites them.
find_program(GSHARD_CLANG_FORMAT NAMES clang-format clang-format-14 clang-format-15 clang-format-16)
if(NOT GSHARD_CLANG_FORMAT)
  return()
endif()
file(GLOB_RECURSE GSHARD_FORMAT_SOURCES CONFIGURE_DEPENDS
  "${PROJECT_SOURCE_DIR}/include/*.hpp"
  "${PROJECT_SOURCE_DIR}/examples/*.cpp" "${PROJECT_SOURCE_DIR}/examples/*.hpp"
  "${PROJECT_SOURCE_DIR}/tests/*.cpp" "${PROJECT_SOURCE_DIR}/tests/*.hpp"
  "${PROJECT_SOURCE_DIR}/bench/*.cpp" "${PROJECT_SOURCE_DIR}/bench/*.hpp")
add_custom_target(format-check
  COMMAND "${GSHARD_CLANG_FORMAT}" --dry-run --Werror ${GSHARD_FORMAT_SOURCES}
  WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
  COMMENT "Checking formatting with ${GSHARD_CLANG_FORMAT}"
  VERBATIM)
add_custom_target(format
  COMMAND "${GSHARD_CLANG_FORMAT}" -i ${GSHARD_FORMAT_SOURCES}
  WORKING_DIRECTORY "${PROJECT_SOURCE_DIR}"
  VERBATIM)
