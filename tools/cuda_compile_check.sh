#!/usr/bin/env bash
# CUDA compile check for machines without a GPU: builds fuseops with its CUDA
# kernels (FUSEOPS_CUDA=ON, sm_90) against the CUDA 13.0 build of torch 2.14.1
# and nvcc from /usr/local/cuda, in a second virtualenv (.venv-cuda), then
# runs a smoke test of that build: it reports CUDA, every op with a CPU
# kernel has a CUDA kernel too, and the ops' opcheck, Meta and pybind tests
# pass under that other torch (schema and FakeTensor behaviour drift between
# torch releases). The CPU kernels are the same code the main suite tests;
# a CUDA call would fail here with "no NVIDIA driver".
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

# What this check needs of the host code: the library and the pybind module,
# warnings as errors as in the main build. The gtests are the main build's
# (they would not run here), and the CPU kernels are built as DEFAULT only
# (the AVX2/AVX512 builds are the same code under other flags, which the main
# build compiles and tests): about half of a cold build's compile time.
FUSEOPS_VENV=.venv-cuda FUSEOPS_TORCH=2.14.1 FUSEOPS_BUILD_DIR=build/wheel-cuda \
  FUSEOPS_BUILD_TESTS=OFF \
  FUSEOPS_PIP_ARGS="-C cmake.define.FUSEOPS_CUDA=ON -C cmake.define.FUSEOPS_WERROR=ON
    -C cmake.define.FUSEOPS_CPU_CAPABILITIES=DEFAULT" bash tools/setup.sh

py=.venv-cuda/bin/python
"$py" - <<'PY'
import torch, fuseops
info = fuseops.build_info()
print("fuseops", info["version"], "torch", torch.__version__, "CUDA", info["cuda_version"],
      "architectures", info["cuda_architectures"])
assert info["cuda"], "fuseops was built without its CUDA kernels"
assert info["cuda_architectures"] == ["9.0"], info["cuda_architectures"]
PY
# Every op registered for CPU is registered for CUDA too.
"$py" - <<'PY'
import torch, fuseops
def ops(key):
    return {r for r in torch._C._dispatch_get_registrations_for_dispatch_key(key) if r.startswith("fuseops::")}
missing = sorted(ops("CPU") - ops("CUDA"))
assert not missing, f"no CUDA kernel for {missing}"
print(f"CUDA kernels for all {len(ops('CPU'))} fuseops ops and overloads")
PY

echo "== smoke test of the CUDA build on CPU (opcheck, Meta, pybind, README)"
PATH="$PWD/.venv-cuda/bin:$PATH" "$py" -m pytest tests_py -q \
  -k "opcheck or meta or pybind or build_info or readme" --ignore=tests_py/test_gdb.py "$@"
