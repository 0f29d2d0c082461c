#include "kernels/cuda/launch_control.h"

namespace tandem::cuda {
namespace {

thread_local bool programmatic_launch = false;

}  // namespace

void SetProgrammaticLaunch(bool on) { programmatic_launch = on; }
bool ProgrammaticLaunch() { return programmatic_launch; }

}  // namespace tandem::cuda
