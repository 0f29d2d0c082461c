// Programmatic dependent launch (PDL, sm_90+) for the kernels of this library that support
// it: with it on, such a kernel is launched with cudaLaunchAttributeProgrammaticStreamSerialization,
// so that it may start while the previous kernel of the stream finishes; it does only
// independent work (reading weights into L2 or registers) before `griddepcontrol.wait`,
// which returns once the previous kernel has completed and its writes are visible, and it
// lets its own successor start early (`griddepcontrol.launch_dependents`) right after. A
// dependent launch captured into a CUDA graph becomes a programmatic edge. Kernels that do
// not support it are launched as usual and keep full stream ordering.
//
// The setting is per host thread (the thread that enqueues), off by default.
#pragma once

namespace tandem::cuda {

void SetProgrammaticLaunch(bool on);
bool ProgrammaticLaunch();

// Sets the calling thread's setting for a scope, restoring the previous one.
class ScopedProgrammaticLaunch {
 public:
  explicit ScopedProgrammaticLaunch(bool on) : previous_(ProgrammaticLaunch()) { SetProgrammaticLaunch(on); }
  ~ScopedProgrammaticLaunch() { SetProgrammaticLaunch(previous_); }
  ScopedProgrammaticLaunch(const ScopedProgrammaticLaunch&) = delete;
  ScopedProgrammaticLaunch& operator=(const ScopedProgrammaticLaunch&) = delete;

 private:
  bool previous_;
};

}  // namespace tandem::cuda
