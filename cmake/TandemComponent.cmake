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
#
# A binary labelled gpu is registered case by case instead (gtest_discover_tests at ctest
# time: "NAME.Suite.Case"), each case its own ctest test, and its main()
# (tests/support/gpu_test_main.h) exits 77 when every case it ran skipped: ctest reports
# each case passed, failed or skipped (no usable GPU) on its own, so a skip never hides a
# failure of another case. (An output regex would: it marks a test skipped whatever its
# exit status.)
include(GoogleTest)
function(tandem_test name)
  cmake_parse_arguments(ARG "" "TIMEOUT" "SOURCES;DEPS;LABELS;ENV;FIXTURES" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR})
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  if(NOT ARG_LABELS)
    set(ARG_LABELS unit)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  set(env "TANDEM_SOURCE_DIR=${PROJECT_SOURCE_DIR};TANDEM_BINARY_DIR=${PROJECT_BINARY_DIR};${ARG_ENV}")
  if(NOT "gpu" IN_LIST ARG_LABELS)
    target_link_libraries(${name} PRIVATE tandem_build_flags ${ARG_DEPS} GTest::gtest GTest::gtest_main)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES LABELS "${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${env}")
    if(ARG_FIXTURES)
      set_tests_properties(${name} PROPERTIES FIXTURES_REQUIRED "${ARG_FIXTURES}")
    endif()
    return()
  endif()
  target_link_libraries(${name} PRIVATE tandem_build_flags ${ARG_DEPS} tandem_gpu_test_main GTest::gtest)
  gtest_discover_tests(${name} TEST_PREFIX "${name}." DISCOVERY_MODE PRE_TEST TEST_LIST ${name}_cases
    DISCOVERY_TIMEOUT 60)
  # The cases' properties, set after discovery (gtest_discover_tests' PROPERTIES splits
  # list values such as LABELS and ENVIRONMENT). The empty skip regex drops the one
  # gtest_discover_tests sets: skipped is the exit status 77 alone.
  set(props "${CMAKE_CURRENT_BINARY_DIR}/${name}_case_properties.cmake")
  set(fixtures "")
  if(ARG_FIXTURES)
    set(fixtures " FIXTURES_REQUIRED [==[${ARG_FIXTURES}]==]")
  endif()
  file(WRITE "${props}" "if(${name}_cases)\n  set_tests_properties(\${${name}_cases} PROPERTIES "
    "LABELS [==[${ARG_LABELS}]==] TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT [==[${env}]==] SKIP_RETURN_CODE 77 "
    "SKIP_REGULAR_EXPRESSION [==[]==]${fixtures})\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${props}")
endfunction()
