"""The drafting policy: when to draft, from which source, and how much of a draft to verify. A policy only: whatever
it decides, verification keeps the output exact, because every choice reads past rounds (their committed tokens and
timings) and never the token being verified.

Each round has three kinds of source, tried in this order: a copied draft (free, no network call: prompt lookup in
the conversation, the target's phrasebook, or the rest of the network's last block; core.drafting.base.LookupHybrid),
the drafter's network, or none (a plain step). The round's event carries the decision (sources.Decision).

config       PolicyConfig: every constant, with its reason
policy       DraftPolicy: one generation's rounds (draft, observe) and the decision each made
waits        when a source may draft: back-off after drafts that did not pay, plain probes, the measured verdict
             against plain steps, the network's feature capture
cut          how much of a draft to verify under the verify cost
copy_choice  which copy, cut where, and copy tries
rates        measured acceptance of copies (per source and key) and of sampled network drafts (per slot)
costs        measured cost of a network call and of a round by its length
state        PolicyState: what a reply measured, carried to the conversation's next
sources      what a round verified, where its kept tokens came from, and Decision

Modules import each other directly (no names are re-exported here), so core.drafting.base may read the config.
"""
