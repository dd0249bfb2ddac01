"""Tree verification (paper App. D): the trie, its attention mask, the greedy walk, and the engine."""
import numpy as np
import pytest
import torch

from core.decoding.engine import GenerationConfig, generate_all
from core.drafting.base import MAX_BLOCK_SIZE, Draft
from core.runtime.trie import ancestor_mask, build_trie, is_chain, tree_inputs
from core.verification.sampling import SamplingConfig
from core.verification.tree import depth_in, greedy_path, walk
from lab.testing import assert_sampled_distribution_exact, make_target, tiny_llama, tiny_qwen3


def test_trie_merges_common_prefixes_breadth_first_within_the_budget():
    trie = build_trie([[5, 6, 7], [5, 8], [9, 6, 7, 1]], budget=16)
    # depth 1: 5, 9; depth 2: 5-6, 5-8, 9-6; depth 3: 5-6-7, 9-6-7; depth 4: 9-6-7-1
    assert trie.tokens == (5, 9, 6, 8, 6, 7, 7, 1)
    assert trie.parents == (-1, -1, 0, 0, 1, 2, 4, 6)
    assert trie.depths == (1, 1, 2, 2, 2, 3, 3, 4)
    cut = build_trie([[5, 6, 7], [5, 8], [9, 6, 7, 1]], budget=4)
    assert cut.tokens == (5, 9, 6, 8)  # the shallow nodes are kept, every deeper one of a cut branch goes
    assert len(build_trie([[1, 2], [1, 2]], budget=16)) == 2  # equal drafts are one chain
    assert len(build_trie([], budget=16)) == 0 and len(build_trie([[]], budget=16)) == 0
    for budget in (0, 2, 16):  # one draft's chain, made directly, is the trie the merge makes of it
        assert build_trie([[4, 5, 6, 7]], budget) == build_trie([[4, 5, 6, 7], [4, 5, 6, 7]], budget)


def test_chain_detection_and_depth_of_a_branch():
    assert is_chain(build_trie([[4, 5, 6]], 16)) and is_chain(build_trie([[4, 5], [4, 5]], 16))
    assert not is_chain(build_trie([[4, 5], [4, 6]], 16))
    trie = build_trie([[5, 6, 7], [5, 8]], budget=3)  # 5, 5-6, 5-8: the third node of branch 0 is cut
    assert depth_in(trie, [5, 6, 7]) == 2 and depth_in(trie, [5, 8, 1]) == 2 and depth_in(trie, [9]) == 0


def test_ancestor_mask_and_positions():
    trie = build_trie([[5, 6], [5, 8], [9]], budget=16)  # nodes: 5, 9, 5-6, 5-8
    mask = ancestor_mask(trie)  # rows/cols: anchor, 5, 9, 6, 8
    expected = torch.tensor([[1, 0, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 0, 1, 0, 0],
                             [1, 1, 0, 1, 0],
                             [1, 1, 0, 0, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    full, positions = tree_inputs(trie, past=3, device="cpu")
    assert full.shape == (1, 1, 5, 8) and full[0, 0, :, :3].all() and torch.equal(full[0, 0, :, 3:], expected)
    assert positions.tolist() == [[3, 4, 4, 5, 5]]
    chain = build_trie([[4, 5, 6]], 16)
    assert torch.equal(ancestor_mask(chain), torch.ones(4, 4, dtype=torch.bool).tril())


def test_greedy_walk_follows_the_targets_argmax_down_any_branch():
    trie = build_trie([[5, 6, 7], [5, 8, 2], [9]], budget=16)  # 5, 9, 5-6, 5-8, 5-6-7, 5-8-2
    # argmax per position (anchor, then each node): anchor -> 5, node 5 -> 8, node 5-8 -> 2, node 5-8-2 -> 4
    argmax = [5, 8, 0, 0, 2, 0, 4]
    path, next_token = greedy_path(trie, argmax)
    assert [trie.tokens[n] for n in path] == [5, 8, 2] and next_token == 4
    assert greedy_path(trie, [7, 0, 0, 0, 0, 0, 0]) == ([], 7)  # nothing matches: the target's own token


class BranchingOracle:
    """Knows the greedy continuation; proposes `branches` drafts per round, each corrupted on its own and cut
    at a random length, so the accepted path often runs through an alternative. Records its drafts and every
    feature row it is given."""

    name = "branching-oracle"
    feature_layers = (1, 2)
    max_block_size = MAX_BLOCK_SIZE

    def __init__(self, reference, prompt_len, branches, corrupt, vocab, seed=0):
        self.reference, self.prompt_len, self.branches = reference, prompt_len, branches
        self.corrupt, self.vocab = corrupt, vocab
        self.rng = np.random.default_rng(seed)
        self.committed, self.features, self.proposed = [], [], []

    def reset(self):
        self.committed, self.features, self.proposed = [], [], []

    def extend(self, token_ids, features):
        self.committed += list(token_ids)
        self.features.append(features.clone())

    def propose(self, anchor, block_size, sampling, generator):
        start = len(self.committed) - self.prompt_len + 1
        truth = list(self.reference[start:start + block_size])
        drafts = []
        for _ in range(self.branches):
            draft = [t if self.rng.random() > self.corrupt else int(self.rng.integers(4, self.vocab)) for t in truth]
            drafts.append(draft[: int(self.rng.integers(0, block_size + 1))])
        self.proposed.append(drafts)
        return Draft(torch.tensor(drafts[0], dtype=torch.long), None, None, tuple(map(tuple, drafts[1:])))


@pytest.mark.parametrize("make", [lambda: tiny_llama(vocab_size=64), lambda: tiny_qwen3(vocab_size=64)])
def test_tree_rounds_equal_plain_decoding_and_feed_the_right_features(make):
    target = make_target(make())
    vocab = target.vocab_size
    rng = np.random.default_rng(1)
    via_alternative = 0
    for i in range(8):
        prompt = rng.integers(4, vocab, size=int(rng.integers(1, 10))).tolist()
        plain, _ = generate_all(target, prompt, GenerationConfig(max_new_tokens=30, block_size=1))
        for k in (3, 8, 16):
            oracle = BranchingOracle(plain, len(prompt), branches=3, corrupt=0.3, vocab=vocab, seed=i * 100 + k)
            out, events = generate_all(target, prompt, GenerationConfig(max_new_tokens=30, block_size=k), oracle)
            assert out == plain, (i, k)
            tree_rounds = [ev for ev in events if ev.branches == 3]  # one per propose call, in order
            assert len(tree_rounds) == len(oracle.proposed)
            offset = 1  # the prefill committed the first token
            for ev in events[1:]:
                accepted = ev.drafted[: ev.n_accepted]
                assert list(accepted) == out[offset: offset + ev.n_accepted]  # the shown branch holds the path
                offset += len(ev.committed)
            for ev, drafts in zip(tree_rounds, oracle.proposed):
                n = ev.n_accepted
                via_alternative += n > 0 and tuple(drafts[0][:n]) != ev.drafted[:n]
            # every feature row the drafter saw is the target's hidden state at that position in a plain forward
            seen = torch.cat(oracle.features)  # (N, F)
            with torch.no_grad():
                hidden = target.model(torch.tensor([prompt + out]), output_hidden_states=True).hidden_states
            expected = torch.cat([hidden[1][0], hidden[2][0]], dim=-1)[: len(seen)]  # (N, F)
            assert torch.allclose(seen, expected, atol=1e-4), (i, k)
    assert via_alternative > 20  # many accepted paths ran through a draft other than the first


def test_the_walk_asks_for_the_targets_token_only_along_its_path():
    trie = build_trie([[5, 6], [9, 7]], budget=16)  # nodes: 5, 9, 5-6, 9-7
    asked = []

    def token_at(position):
        asked.append(position)
        return {0: 9, 2: 7, 4: 3}[position]  # the anchor's row draws 9, node 9's row 7, node 9-7's row 3

    assert walk(trie, token_at) == ([1, 3], 3) and asked == [0, 2, 4]
    assert walk(trie, lambda position: 8) == ([], 8)  # no child holds it: nothing kept, the target's token next


class TwoBranches:
    """Deterministic drafts with an alternative at the first slot: [a + 1, a + 2] and [a + 3], a the anchor (mod V)."""

    name, feature_layers, max_block_size = "two-branches", (), 4

    def __init__(self, vocab: int):
        self.vocab = vocab

    def reset(self):
        pass

    def extend(self, token_ids, features):
        pass

    def propose(self, anchor, block_size, sampling, generator):
        v = self.vocab
        return Draft([(anchor + 1) % v, (anchor + 2) % v], None, alternatives=(((anchor + 3) % v,),))


def test_tree_drafts_at_positive_temperature_sample_the_target_exactly():
    """Chi-square on the last two of three sampled tokens, each round a trie of two deterministic branches: the walk
    keeps a drafted token exactly when the target drew it, so the output follows the target."""
    target = make_target(tiny_llama(vocab_size=5, layers=2, seed=3, scale=8.0))
    assert_sampled_distribution_exact(target, TwoBranches(5), n=1500, block_size=3)


def test_tree_rounds_at_positive_temperature_keep_the_alternatives_they_drew(tiny_target):
    gen = GenerationConfig(max_new_tokens=40, block_size=3, sampling=SamplingConfig(temperature=1.0), seed=0)
    drafter = TwoBranches(tiny_target.vocab_size)
    out, events = generate_all(tiny_target, [5, 6, 7], gen, drafter)
    rounds = [ev for ev in events[1:] if ev.branches == 2]  # every round with room for a draft
    assert len(out) == 40 and len(rounds) >= 10
    for ev in rounds:  # the round shows the branch it followed, and what it kept is that branch's start
        assert ev.n_accepted <= len(ev.drafted) and ev.committed[: ev.n_accepted] == ev.drafted[: ev.n_accepted]
    assert any(len(ev.drafted) == 1 and ev.n_accepted == 1 for ev in rounds)  # the alternative was drawn and kept
