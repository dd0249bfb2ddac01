"""FlashMap Chat: the product — chat service, Gradio UI, OpenAI-compatible API, bench (CHANGELOG.md: versions)."""

__version__ = "0.53.0"
