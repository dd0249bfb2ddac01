"""The FlashMap drafter: config, network, flow math, training, data, and the engine adapter."""
