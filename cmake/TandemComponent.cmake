# One call declares one component: a static library whose headers are included from the
# repository root ("engine/model/config.h"), with warnings on and its dependencies named.
#
#   tandem_library(tandem_engine_model
#     SOURCES config.cc safetensors.cc
#     DEPS tandem_kernels_cpu absl::status          # public: users of the target see them
#     PRIVATE_DEPS nlohmann_json::nlohmann_json)    # implementation only
#
#   tandem_test(engine_model_config_test
#     SOURCES config_test.cc DEPS tandem_engine_model LABELS unit)
#
#   tandem_executable(tandem SOURCES main.cc DEPS ...)

add_library(tandem_build_flags INTERFACE)
set(TANDEM_HOST_FLAGS -Wall -Wextra -Wno-unused-parameter -Wno-missing-field-initializers)
if(TANDEM_CPU_ARCH)
  list(APPEND TANDEM_HOST_FLAGS -march=${TANDEM_CPU_ARCH})
endif()
string(REPLACE ";" "," TANDEM_HOST_FLAGS_CSV "${TANDEM_HOST_FLAGS}")
target_compile_options(tandem_build_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:${TANDEM_HOST_FLAGS}>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${TANDEM_HOST_FLAGS_CSV}>)

function(tandem_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS} PRIVATE tandem_build_flags ${ARG_PRIVATE_DEPS})
endfunction()

function(tandem_executable name)
  cmake_parse_arguments(ARG "" "OUTPUT_NAME" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE tandem_build_flags ${ARG_DEPS})
  if(ARG_OUTPUT_NAME)
    set_target_properties(${name} PROPERTIES OUTPUT_NAME ${ARG_OUTPUT_NAME})
  endif()
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

# A gtest binary registered as one ctest test. LABELS: unit, integration or gpu.
# ENV: extra environment ("NAME=value") for the test. FIXTURES: fixtures it requires.
function(tandem_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS;ENV;FIXTURES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE tandem_build_flags ${ARG_DEPS} GTest::gtest GTest::gtest_main)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  add_test(NAME ${name} COMMAND ${name})
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
    ENVIRONMENT "TANDEM_SOURCE_DIR=${PROJECT_SOURCE_DIR};TANDEM_BINARY_DIR=${PROJECT_BINARY_DIR};${ARG_ENV}")
  if(ARG_FIXTURES)
    set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED "${ARG_FIXTURES}")
  endif()
endfunction()
