#!/usr/bin/env bash
# The bench's optional llama.cpp anchor (`python -m app.bench ... --vs llama.cpp`): builds llama-cpp-python 0.3.36
# from source into .venv (~8 minutes on 2 cores). Build flags follow this CPU's: its default native build turns on
# AMX int8 and, on an AMX CPU, segfaulted at the first decode (measured), so the x86 features are named one by one
# and AMX stays off. Usage: bash scripts/install_llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
on() { case " $flags " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
args="-DGGML_NATIVE=OFF -DGGML_AVX=$(on avx) -DGGML_AVX2=$(on avx2) -DGGML_FMA=$(on fma) -DGGML_F16C=$(on f16c)"
args="$args -DGGML_AVX512=$(on avx512f) -DGGML_AVX512_VNNI=$(on avx512_vnni) -DGGML_AVX512_BF16=$(on avx512_bf16)"
args="$args -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF"
echo "CMAKE_ARGS=$args"
CMAKE_ARGS="$args" .venv/bin/pip install -q --no-deps llama-cpp-python==0.3.36 diskcache==5.6.3
.venv/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
