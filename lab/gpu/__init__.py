"""One prepared run on a borrowed GPU machine: stages, the staged transfer of the embedded
target, command 1 (Qwen3-8B's architecture with random weights) and command 2 (the embedded drafters
trained at GPU scale). Entry point: python -m lab.gpu_run (docs/gpu-run.md)."""
