# Third-party dependencies, all from Debian packages (docs/design.md §10). Nothing is vendored
# or downloaded at build time.
find_package(Threads REQUIRED)
find_package(absl CONFIG REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
find_package(CLI11 CONFIG REQUIRED)

if(TANDEM_BUILD_TESTS)
  find_package(GTest CONFIG REQUIRED)
endif()
if(TANDEM_BUILD_BENCH)
  find_package(benchmark CONFIG REQUIRED)
endif()
