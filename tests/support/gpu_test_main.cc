// main() of the GPU test binaries (gpu_test_main.h).
#include "tests/support/gpu_test_main.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return tandem::testing::RunGpuTests();
}
