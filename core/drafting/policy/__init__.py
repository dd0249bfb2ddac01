"""The drafting policy: when to draft, from which source, and how much of a draft to verify, by one rule (policy): each
source its verdict allows offers expected tokens for a cost (offers: copies, the network, a plain step) and the round
takes the most tokens per unit of cost. Every choice reads past rounds (state: the one store of what was measured),
never the token being verified, so the output stays exact whatever it decides. config holds every constant.
Modules import each other directly (nothing is re-exported here), so core.drafting.base may read the config."""
