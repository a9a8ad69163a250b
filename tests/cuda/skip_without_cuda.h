// The first statement of every `gpu`-labelled test: it skips, naming the reason, where LibTorch
// sees no CUDA device, so the tests build and pass in CPU-only trees.
#pragma once

#include <gtest/gtest.h>
#include <torch/cuda.h>

#define STRIDER_SKIP_WITHOUT_CUDA()                                           \
  do {                                                                        \
    if (!torch::cuda::is_available()) {                                       \
      GTEST_SKIP() << "no CUDA device: torch::cuda::is_available() is false"; \
    }                                                                         \
  } while (false)
