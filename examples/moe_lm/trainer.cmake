# The main job's support headers and its compiled half (model and trainer), shared by the program
# (examples/moe_lm) and its tests (tests/unit/nn/moe_lm_train_test.cpp); included from both.
# The model's forward pass is explicitly instantiated in model_*.cpp, one block kind per file, so
# no translation unit compiles the whole model (docs/performance.md, compile times).
include_guard(GLOBAL)
# CLI11 comes from Debian's libcli11-dev (scripts/install-deps.sh).
find_package(CLI11 2.1 CONFIG REQUIRED)
add_library(moe_lm_support INTERFACE)
target_include_directories(moe_lm_support INTERFACE "${CMAKE_CURRENT_LIST_DIR}")
target_link_libraries(moe_lm_support INTERFACE gshard::gshard CLI11::CLI11)

add_library(moe_lm_trainer STATIC)
foreach(file model_attention model_ffn model_router model_experts model_loss trainer trainer_run)
  target_sources(moe_lm_trainer PRIVATE "${CMAKE_CURRENT_LIST_DIR}/${file}.cpp")
endforeach()
target_link_libraries(moe_lm_trainer PUBLIC moe_lm_support PRIVATE gshard_warnings)
if(GSHARD_BUILD_TESTS AND _gshard_slow_opt)  # its tests run it for minutes at -O0 (asan preset)
  target_compile_options(moe_lm_trainer PRIVATE ${_gshard_slow_opt})
endif()
