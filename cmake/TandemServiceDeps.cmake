# Third-party dependencies of the services' shared plumbing (services/common): all from
# Debian packages (docs/design.md §10). Included by services/common/CMakeLists.txt; the
# engine-only build never reads this file. The imported targets are GLOBAL (CMake 3.24+)
# so that services/* and tests/unit/services/* can name them wherever this was included
# first.
include_guard(GLOBAL)

# Asio / Beast (header-only). 1.81: 1.74's Asio lacks as_tuple (BUILD-NOTES.md).
find_package(Boost 1.81 CONFIG REQUIRED GLOBAL)
find_package(prometheus-cpp CONFIG REQUIRED GLOBAL)  # prometheus-cpp::core
find_package(yaml-cpp CONFIG REQUIRED GLOBAL)        # target `yaml-cpp` (0.7 has no namespace)
find_package(spdlog CONFIG REQUIRED GLOBAL)          # spdlog::spdlog, with Debian's external fmt
