"""FlashMap Chat: target loading, the speculative decoding engine, verification math, bench CLI and UI."""
