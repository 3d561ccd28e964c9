#!/usr/bin/env bash
# Fill a wheelhouse for scripts/gpu_check.sh: the wheels an offline GPU machine that already has torch and triton
# (and so numpy, pyyaml, safetensors, packaging, ...) lacks to install relax-gym and run its GPU checks. Run it here,
# where PyPI is reachable; carry the folder along.
#
#   scripts/gpu_wheelhouse.sh [DIR]            # default DIR: wheelhouse/ at the repository root (git-ignored)
#   PYTHON_VERSION=3.12 scripts/gpu_wheelhouse.sh   # wheels for another CPython than 3.11
#   SPLIT_MIB=50 scripts/gpu_wheelhouse.sh     # also DIR.parts/part.NN, each at most 50 MiB (a tar of DIR, cut up):
#                                              # for a transfer with a size limit; `cat part.* | tar x` joins them
#
# transformers is carried even where the machine has one: relax-gym needs >= 5.21 (the Qwen2.5-Omni thinker's module
# layout), and the H200 machine's 5.17.0 failed the first GPU run (docs/gpu-results.md). Ray is carried for the
# megatron_group check. The whole wheelhouse is ~150 MiB (av ~34, ray ~76, transformers ~13).
#
# Only wheels, for linux x86_64 and CPython $PYTHON_VERSION (pure-python ones are py3-none-any), downloaded with
# --no-deps from the pinned list below: the list is the closure the checks import, minus what the GPU machine has,
# at the versions the CPU test environment runs. hatchling (+ its deps) is included so the GPU machine can build
# relax-gym itself from its checkout offline. The list is also written to DIR/requirements.txt.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-$REPO/wheelhouse}"
PY="${PYTHON:-$REPO/.venv/bin/python}"
PYVER="${PYTHON_VERSION:-3.11}"
ABI="cp${PYVER/./}"

PACKAGES=(
  # the megatron backend
  megatron-core==0.16.1 psutil==7.2.2
  # relax_gym.envs / omni: gymnasium envs, media decoding
  gymnasium==1.4.0 cloudpickle==3.1.3 farama-notifications==0.0.6
  av==18.1.0 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 pillow==13.0.0
  # config, engine client
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  httpx==0.28.1 httpcore==1.0.9 h11==0.16.0 anyio==4.16.0 idna==3.20 certifi==2026.10.19.post1
  typer==0.29.2 annotated-doc==0.0.7 click==8.5.1 shellingham==1.5.4 rich==15.0.0 markdown-it-py==4.3.0 mdurl==0.1.2 pygments==2.21.0
  # newer than some torch installs bring (pydantic and megatron-core need these)
  typing-extensions==4.16.0 packaging==26.4
  # building relax-gym from the checkout, offline
  hatchling==1.27.0 pathspec==0.12.1 pluggy==1.7.0 trove-classifiers==2025.5.9.12
  # transformers at the version the CPU suite runs, and what it needs newer than the GPU machine's
  transformers==5.25.0 huggingface-hub==2.4.0 kernels==0.19.1 tomlkit==0.15.3 hf-xet==1.8.0 httpx2==2.16.2
  httpcore2==2.16.2 truststore==0.10.5 tokenizers==0.23.3 regex==2026.11.19
  # the rank-group launcher (megatron_group): Ray and what it needs beyond the machine's packages
  ray==2.60.0 jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1
)

mkdir -p "$OUT"
echo "downloading ${#PACKAGES[@]} wheels for CPython $PYVER linux x86_64 into $OUT"
"$PY" -m pip download --quiet -c "$REPO/constraints.txt" --no-deps --only-binary=:all: -d "$OUT" \
  --implementation cp --python-version "$PYVER" --abi "$ABI" --abi abi3 --abi none \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform linux_x86_64 --platform any \
  "${PACKAGES[@]}"
printf '%s\n' "${PACKAGES[@]}" > "$OUT/requirements.txt"
echo "$PYVER" > "$OUT/python-version"
count=$(find "$OUT" -maxdepth 1 -name '*.whl' | wc -l)
size=$(du -sh "$OUT" | cut -f1)
echo "wheelhouse ready: $count wheels, $size in $OUT"
if [ -n "${SPLIT_MIB:-}" ]; then
  case "$SPLIT_MIB" in ''|*[!0-9]*|0) echo "gpu_wheelhouse.sh: SPLIT_MIB must be a positive integer, got '$SPLIT_MIB'" >&2; exit 2 ;; esac
  parts="$OUT.parts"
  rm -rf "$parts"; mkdir -p "$parts"
  tar cf - -C "$(dirname "$OUT")" "$(basename "$OUT")" | split -b "${SPLIT_MIB}M" -d - "$parts/part."
  echo "split into $(ls "$parts" | wc -l) parts of at most $SPLIT_MIB MiB in $parts: cat part.* | tar x  (gives $(basename "$OUT")/)"
fi
