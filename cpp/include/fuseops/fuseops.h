#pragma once
// The fuseops C++ API. Every function calls its op through the PyTorch
// dispatcher (so CPU, CUDA and autograd all apply); link fuseops::fuseops.

#include <fuseops/build_info.h>
#include <fuseops/relu.h>
