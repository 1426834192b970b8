// superkernel (runtime/inductor/wrapper_pch.py): Inductor's C++-wrapper header for the CPU and its CPU
// kernel header, precompiled as one header for the builds of C++-wrapper modules.
#include <torch/csrc/inductor/cpp_wrapper/cpu.h>
#include <torch/csrc/inductor/cpp_prefix.h>
