#pragma once
// The fuseops C++ API. Every function calls its op through the PyTorch
// dispatcher (so CPU, CUDA and autograd all apply); link fuseops::fuseops.

#include <fuseops/activation.h>
#include <fuseops/build_info.h>
#include <fuseops/gated_activation.h>
#include <fuseops/layer_norm.h>
#include <fuseops/relu.h>
#include <fuseops/rms_norm.h>
