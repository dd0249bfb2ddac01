"""What a round verified and why: its source (plain, a copy's, or the network's), where its kept tokens came from, and
the policy's decision as the round's event carries it."""
from __future__ import annotations

from dataclasses import dataclass

from core.drafting.base import Draft

COPIED = ("lookup", "phrasebook", "tail")  # the free sources' round names (Draft.lookup_source)


def round_source(draft: Draft) -> str:
    """What a round verified: "plain" (nothing), "lookup", "phrasebook" or "tail" (a copied draft, no network call) or
    "drafter"."""
    if len(draft.tokens) == 0:
        return "plain"
    return draft.lookup_source if draft.lookup_match else "drafter"


def shown_source(draft: Draft) -> str:
    """What a round verified, as its event says it: round_source, but a copy joined beside an empty network draft
    (Copies: the network proposes nothing) is that copy's round, not a plain step."""
    if len(draft.tokens) == 0 and draft.branch_source:
        return draft.branch_source
    return round_source(draft)


def kept_source(draft: Draft, followed: list[int]) -> str:
    """Where a round's kept draft tokens came from, `followed` being the branch the target followed: the draft's own
    source (round_source), or where that is one of its alternatives, the alternative's: the other copy of a copy try,
    a copy beside the network's draft (Draft.branch_source), or another of the network's drafts (a tree)."""
    if not draft.alternatives or not followed or draft.ids[: len(followed)] == list(followed):
        return round_source(draft)
    if draft.beside is not None:
        return draft.beside[0]
    return draft.branch_source or "drafter"


@dataclass(frozen=True)
class Decision:
    """Why a round verified what it did (policy.DraftPolicy.draft): its source (shown_source), what the free sources
    offered or why they were not asked, and whether the network was called or why not. Read by the UI's round panel,
    the bench's summary and the tests."""

    source: str
    copies: str
    network: str

    def why(self) -> str:
        """What the copies and the network came to, without the source: "copies ...; network ..."."""
        return f"copies {self.copies}; network {self.network}"

    def text(self) -> str:
        return f"{self.source}: {self.why()}"


# why a source was not asked, or what came of asking it (Decision.copies / Decision.network)
PROBE = "not asked: a plain step is due (plain probe)"
NO_FREE_SOURCES = "none: this drafter has no free sources"
NONE_FOUND = "none found"
NONE_PAYS = "none pays under the cut"
SLOWER = "waiting: measured slower than plain steps in this reply"
MEASURING = "waiting: plain steps are measured first"
DID_NOT_PAY = "waiting: its last drafts did not pay for its call"
COPY_TAKEN = "not asked: a copy pays"
NO_FEATURES = "waiting: its features are being captured"
CUT_EMPTY = "called: its draft was cut to nothing"
SAMPLED_EMPTY = "not called: its measured acceptance cuts any draft to nothing"
