# gRPC and Protobuf from Debian (module-mode Protobuf; gRPC's CMake config). Services only.
find_package(Protobuf REQUIRED)
find_package(gRPC CONFIG REQUIRED)
