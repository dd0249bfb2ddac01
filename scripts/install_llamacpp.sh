#!/usr/bin/env bash
# The bench's optional llama.cpp anchor (`python -m app.bench ... --vs llama.cpp`), both from the llama.cpp source that
# llama-cpp-python 0.3.36 vendors: llama.cpp's own llama-bench into .llamacpp/bin (~4 minutes on 2 cores), and
# llama-cpp-python into .venv (~8 minutes). Build flags follow this CPU's: llama.cpp's default native build turns on
# AMX int8 and, on an AMX CPU, segfaulted at the first decode (measured), so the x86 features are named one by one and
# AMX stays off. Usage: bash scripts/install_llamacpp.sh [native]   (native: the binary alone)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
version=0.3.36
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
on() { case " $flags " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
args="-DGGML_NATIVE=OFF -DGGML_AVX=$(on avx) -DGGML_AVX2=$(on avx2) -DGGML_FMA=$(on fma) -DGGML_F16C=$(on f16c)"
args="$args -DGGML_AVX512=$(on avx512f) -DGGML_AVX512_VNNI=$(on avx512_vnni) -DGGML_AVX512_BF16=$(on avx512_bf16)"
args="$args -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF"
echo "CMAKE_ARGS=$args"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
.venv/bin/pip download -q --no-binary :all: --no-deps "llama-cpp-python==$version" -d "$work"
tar xzf "$work/llama_cpp_python-$version.tar.gz" -C "$work"
# shellcheck disable=SC2086
cmake -S "$work/llama_cpp_python-$version/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  $args >/dev/null
cmake --build "$work/build" --target llama-bench -j "$(nproc)" >/dev/null
mkdir -p .llamacpp/bin
cp "$work/build/bin/llama-bench" .llamacpp/bin/
.llamacpp/bin/llama-bench --version 2>&1 | head -1

if [ "${1:-}" != native ]; then
  CMAKE_ARGS="$args" .venv/bin/pip install -q --no-deps "$work/llama_cpp_python-$version.tar.gz" diskcache==5.6.3
  .venv/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
fi
