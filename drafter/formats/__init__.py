"""Drafter folders on disk: the project's checkpoints (checkpoint), the released FlashMap format (release), the
published DFlash format (dflash) and the export to it (export).
"""
