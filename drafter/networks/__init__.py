"""The drafters' networks: the project's DiT (dit), the released FlashMap architecture (release), the published DFlash
one (dflash), a FlashMap on the DFlash backbone (zlab_flow), and the rotary embeddings they share (rotary).
"""
