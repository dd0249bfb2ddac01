#!/usr/bin/env bash
# An exported DFlash-format drafter in llama.cpp (docs/serving.md): converted by llama.cpp's own converter and run by
# its DFlash speculative decoding (`--spec-type draft-dflash`) on the embedded GGUF, beside llama.cpp's plain decoding
# of the same prompt at T = 0.
# Usage: bash scripts/llamacpp_dflash.sh EXPORT_DIR [PROMPT] [TOKENS]     (CONVERT_ONLY=1: the conversion alone)
# The llama.cpp source is the one llama-cpp-python 0.3.36 vendors (its sdist, from PyPI); two tools are built from it
# with the x86 features of this CPU named one by one, AMX off (as scripts/install_llamacpp.sh; ~10 minutes on 2 cores,
# once). The converter runs in .venv-vllm (scripts/install_vllm.sh), which has what it imports (sentencepiece, gguf's
# numpy). The target folder it reads for the tokenizer is written by `python -m drafter.formats.export --target-out`.
set -euo pipefail
cd "$(dirname "$0")/.."
EXPORT=${1:?usage: bash scripts/llamacpp_dflash.sh EXPORT_DIR [PROMPT] [TOKENS]}
PROMPT=${2:-"<|im_start|>user
What is 12 times 7? Explain step by step.<|im_end|>
<|im_start|>assistant
"}
TOKENS=${3:-64}
SRC=runs/llama.cpp-src/llama_cpp_python-0.3.36/vendor/llama.cpp
BUILD=runs/llama.cpp-build
TARGET_DIR=runs/serve-target
OUT=runs/llama.cpp-dflash
mkdir -p "$OUT"
if [ ! -f "$SRC/convert_hf_to_gguf.py" ]; then
  .venv/bin/pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d runs/llama.cpp-src
  tar xzf runs/llama.cpp-src/llama_cpp_python-0.3.36.tar.gz -C runs/llama.cpp-src
fi
[ -f "$TARGET_DIR/config.json" ] || .venv/bin/python -m drafter.formats.export --target-out "$TARGET_DIR"
PYTHONPATH="$SRC/gguf-py" .venv-vllm/bin/python "$SRC/convert_hf_to_gguf.py" "$EXPORT" \
    --target-model-dir "$TARGET_DIR" --outfile "$OUT/drafter.gguf" --outtype f32
[ -z "${CONVERT_ONLY:-}" ] || exit 0  # CONVERT_ONLY=1: stop at $OUT/drafter.gguf (tests/test_export.py)
if [ ! -x "$BUILD/bin/llama-speculative-simple" ]; then
  flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)
  on() { case " $flags " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
  cmake -B "$BUILD" -S "$SRC" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF -DGGML_AVX="$(on avx)" -DGGML_AVX2="$(on avx2)" \
      -DGGML_FMA="$(on fma)" -DGGML_F16C="$(on f16c)" -DGGML_AVX512="$(on avx512f)" \
      -DGGML_AVX512_VNNI="$(on avx512_vnni)" -DGGML_AVX512_BF16="$(on avx512_bf16)" -DGGML_AMX_INT8=OFF \
      -DGGML_AMX_TILE=OFF -DGGML_AMX_BF16=OFF >/dev/null
  cmake --build "$BUILD" --target llama-speculative-simple llama-simple -j 2 >/dev/null
fi
GGUF=$(.venv/bin/python -c "from core.runtime.target import embedded_gguf_path; print(embedded_gguf_path())")
common=(-m "$GGUF" -p "$PROMPT" -n "$TOKENS" --temp 0 -t 2 -c 2048)
"$BUILD/bin/llama-speculative-simple" "${common[@]}" -md "$OUT/drafter.gguf" --spec-type draft-dflash \
    --spec-draft-n-max 15 > "$OUT/dflash.txt" 2> "$OUT/dflash.log" || { tail -20 "$OUT/dflash.log"; exit 1; }
"$BUILD/bin/llama-simple" -m "$GGUF" -n "$TOKENS" "$PROMPT" > "$OUT/plain.txt" 2> "$OUT/plain.log"
echo "--- llama.cpp + DFlash drafter:"; cat "$OUT/dflash.txt"; echo
echo "--- llama.cpp plain:"; cat "$OUT/plain.txt"; echo
grep -E "n_drafted|n_accept|accept  |decoded" "$OUT/dflash.log" | sed 's/^[0-9.]* I //'
# the speculative tool writes one token more than asked (its last round's bonus): compare up to the shorter reply
python3 - "$OUT/dflash.txt" "$OUT/plain.txt" <<'PY'
import sys
drafted, plain = (open(path, encoding="utf-8", errors="replace").read().strip() for path in sys.argv[1:])
same = drafted.startswith(plain) or plain.startswith(drafted)
print("T = 0 reply with the drafter:", "identical to plain decoding" if same else "DIFFERENT from plain decoding")
sys.exit(0 if same else 1)
PY
