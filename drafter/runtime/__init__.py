"""The drafters as the engine calls them (core.drafting.base.Drafter): drafters (the spec's runtime forms), frozen DiT
drafting, the native trunks and the graphed release proposal.
"""
