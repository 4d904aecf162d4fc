# Builds one libFuzzer target with clang (ASan + UBSan) and runs it for a bounded time from its
# seed corpus; fails on any crash, leak, sanitizer report or timeout of an input.
#   cmake -D CLANGXX=... -D SOURCE=... -D INCLUDES="a;b" -D SEEDS=dir -D WORK=dir -D SECONDS=60
#         -D DICT=file -P run_fuzzer.cmake
file(REMOVE_RECURSE "${WORK}/corpus")
file(MAKE_DIRECTORY "${WORK}/corpus" "${WORK}/artifacts")
get_filename_component(name "${SOURCE}" NAME_WE)
set(exe "${WORK}/${name}")
set(include_flags "")
foreach(dir IN LISTS INCLUDES)
  list(APPEND include_flags "-I${dir}")
endforeach()
execute_process(
  COMMAND "${CLANGXX}" -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined
    -fno-sanitize-recover=undefined ${include_flags} "${SOURCE}" -o "${exe}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "could not build ${name}")
endif()
set(dict_args "")
if(DICT)
  set(dict_args "-dict=${DICT}")
endif()
# New inputs go to the work corpus; the seeds in the repository are only read.
execute_process(
  COMMAND "${exe}" -max_total_time=${SECONDS} -timeout=10 -rss_limit_mb=2048 -max_len=4096
    -print_final_stats=1 "-artifact_prefix=${WORK}/artifacts/" ${dict_args} "${WORK}/corpus" "${SEEDS}"
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${name} found a failing input (exit ${rc}); see ${WORK}/artifacts, then "
    "fix it and add the input to ${SEEDS}")
endif()
