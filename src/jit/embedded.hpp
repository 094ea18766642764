// The kernel headers under kernels/, embedded at build time (cmake/embed_kernels.cmake).
#pragma once

#include <cstddef>

namespace deca::jit {

struct EmbeddedFile {
  const char* path;     // relative to the repository root, e.g. "kernels/gqa/params.cuh"
  const char* content;
};

const EmbeddedFile* embedded_files(std::size_t* count);

}  // namespace deca::jit
