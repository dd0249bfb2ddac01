"""Measuring drafters offline: acceptance on held-out replies, confidence calibration, phrasebook copies and sampled
acceptance.
"""
