"""The drafting policy: its one rule (policy), what each source offers and the cut (offers), the one store of what was
measured (state) and every constant (config). Modules import each other directly (nothing is re-exported here), so
core.drafting.base may read the config."""
