#!/usr/bin/env bash
# CUDA compile check for machines without a GPU: builds fuseops with its CUDA
# kernels (FUSEOPS_CUDA=ON, sm_90) against the CUDA 13.0 build of torch 2.14.1
# and nvcc from /usr/local/cuda, in a second virtualenv (.venv-cuda), then
# checks the build reports CUDA and runs the CPU pytest suite against it.
# A CUDA call would fail here with "no NVIDIA driver"; CPU ops must work.
set -euo pipefail
cd "$(dirname "$0")/.."

cuda_home=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$cuda_home/bin/nvcc" ]; then
  echo "cuda_compile_check: no nvcc at $cuda_home/bin/nvcc (set CUDA_HOME)" >&2
  exit 1
fi
# The toolkit's own nvcc first: a wrapper elsewhere on PATH confuses torch's
# CUDA lookup.
export PATH="$cuda_home/bin:$PATH"
export CUDACXX="$cuda_home/bin/nvcc"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}

FUSEOPS_VENV=.venv-cuda FUSEOPS_TORCH=2.14.1 FUSEOPS_BUILD_DIR=build/wheel-cuda \
  FUSEOPS_PIP_ARGS="-C cmake.define.FUSEOPS_CUDA=ON" bash tools/setup.sh

py=.venv-cuda/bin/python
"$py" - <<'PY'
import torch, fuseops
info = fuseops.build_info()
print("fuseops", info["version"], "torch", torch.__version__, "CUDA", info["cuda_version"],
      "architectures", info["cuda_architectures"])
assert info["cuda"], "fuseops was built without its CUDA kernels"
assert info["cuda_architectures"] == ["9.0"], info["cuda_architectures"]
PY
# The CUDA kernels are in the library: the op has a CUDA registration.
"$py" -c "import torch, fuseops; assert torch._C._dispatch_has_kernel_for_dispatch_key('fuseops::relu', 'CUDA')"

echo "== CPU pytest suite against the CUDA build"
# The gdb printers do not depend on how the library was built; the CPU run
# tests them (their fixture build against a CUDA torch would only add time).
PATH="$PWD/.venv-cuda/bin:$PATH" "$py" -m pytest tests_py -q --ignore=tests_py/test_gdb.py "$@"
