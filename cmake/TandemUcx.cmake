# UCX (Debian's libucx-dev), used by the KV transfer layer (services/common/transfer).
# Provides the imported targets ucx::ucp and ucx::ucs. Debian ships a CMake package config;
# pkg-config `ucx` is the fallback for installations without one.
if(NOT TARGET ucx::ucp)
  find_package(ucx CONFIG QUIET)
  if(NOT ucx_FOUND)
    find_package(PkgConfig REQUIRED)
    pkg_check_modules(TANDEM_UCX REQUIRED IMPORTED_TARGET ucx)
    add_library(ucx::ucp INTERFACE IMPORTED)
    target_link_libraries(ucx::ucp INTERFACE PkgConfig::TANDEM_UCX)
    add_library(ucx::ucs INTERFACE IMPORTED)
    target_link_libraries(ucx::ucs INTERFACE PkgConfig::TANDEM_UCX)
  endif()
endif()
