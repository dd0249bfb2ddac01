"""core.decoding.prefix: a prompt that shares its start with the last prompt and reply prefills only the rest, and every
token, event and drafter feature is the same as with a fresh prefill."""
from itertools import islice

import torch

from core.decoding.engine import GenerationConfig, generate
from core.decoding.prefix import PrefixCache, reuses_prefixes
from core.drafting.base import Draft
from core.verification.tree import common_prefix
from lab.testing import tiny_qwen3
from tests.test_lean import lean_target


class FeatureRecorder:
    """A drafter that drafts nothing and records the features the engine hands it for every position."""

    name, max_block_size, feature_layers = "recorder", 4, (1, 2)

    def __init__(self):
        self.ids, self.features = [], []

    def reset(self):
        self.ids, self.features = [], []

    def extend(self, token_ids, features):  # features of the last len(features) of token_ids
        self.ids += list(token_ids)
        self.features.append(features.clone())

    def propose(self, anchor, block_size, sampling, generator):
        return Draft(torch.tensor([(anchor * 7 + 3) % 64] * block_size), None)  # mostly rejected: rounds vary


def run(target, prompt, prefix=None, drafter=None, max_new_tokens=12):
    events = list(generate(target, prompt, GenerationConfig(max_new_tokens=max_new_tokens), drafter, prefix=prefix))
    return [t for ev in events for t in ev.committed], [(ev.drafted, ev.n_accepted, ev.committed) for ev in events]


def native_target(native_prefill=True):
    return lean_target(tiny_qwen3(vocab_size=64, layers=2), "q4-native", torch.bfloat16, None, native_prefill)


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_a_reused_prefix_gives_the_same_replies_and_features_as_a_fresh_prefill():
    target = native_target()
    assert reuses_prefixes(target)
    system = [5, 9, 12, 7, 30, 31, 2, 8] * 3  # 24 positions shared: more than one prefill chunk
    first, second = system + [11, 40, 41], system + [13, 14, 15, 16]
    prefix = PrefixCache()
    fresh = [run(target, prompt, drafter=FeatureRecorder()) for prompt in (first, second)]
    recorders = [FeatureRecorder(), FeatureRecorder()]
    reused = [run(target, prompt, prefix, recorder) for prompt, recorder in zip((first, second), recorders)]
    assert reused == fresh
    fresh_recorder = FeatureRecorder()
    run(target, second, drafter=fresh_recorder)
    assert recorders[1].ids == fresh_recorder.ids
    assert torch.equal(torch.cat(recorders[1].features), torch.cat(fresh_recorder.features))
    assert prefix.ids[: len(second)] == second  # it holds the last prompt and its reply


def test_the_next_turn_reuses_the_prompt_and_the_reply():
    target = native_target()
    prompt = [5, 9, 12, 7, 30, 31, 2, 8, 4, 4]
    prefix = PrefixCache()
    reply, _ = run(target, prompt, prefix)
    turn = prompt + reply + [3, 17, 21]
    cache, reused, _ = prefix.take(target, turn, (), len(turn) + 20)
    assert reused == len(prompt) + len(reply) - 1  # all but the reply's last token, which the cache never held
    prefix = PrefixCache()
    run(target, prompt, prefix)
    assert run(target, turn, prefix) == run(target, turn)


def test_a_plain_reply_reuses_a_drafting_replys_cache_but_a_drafter_needs_its_own_layers():
    target = native_target()
    prompt = [5, 9, 12, 7, 30, 31, 2, 8]
    prefix = PrefixCache()
    run(target, prompt, prefix, FeatureRecorder())
    assert prefix.take(target, prompt, (), 64)[1] == len(prompt) - 1
    assert prefix.take(target, prompt, (1, 2), 64)[1] == len(prompt) - 1
    assert prefix.take(target, prompt, (0, 1), 64)[1] == 0


def test_nothing_is_reused_where_the_prefill_is_not_batch_invariant():
    target = native_target(native_prefill=False)
    assert not reuses_prefixes(target)
    prompt = [5, 9, 12, 7, 30, 31, 2, 8]
    prefix = PrefixCache()
    run(target, prompt, prefix)
    cache, reused, features = prefix.take(target, prompt + [3], (), 64)
    assert (reused, features, cache.length) == (0, None, 0)


def test_a_stopped_reply_leaves_what_its_cache_holds():
    target = native_target()
    prompt = [5, 9, 12, 7, 30, 31, 2, 8]
    prefix = PrefixCache()
    stream = generate(target, prompt, GenerationConfig(max_new_tokens=30), None, prefix=prefix)
    committed = [t for ev in islice(stream, 4) for t in ev.committed]  # prefill and three rounds, then stop
    stream.close()
    assert prefix.ids == prompt + committed[:-1]
    assert run(target, prompt + committed + [3], prefix) == run(target, prompt + committed + [3])


def test_features_kept_for_the_last_positions_only_are_reused_where_the_prefix_reaches_them():
    """A reply that captured no features for a while (core.decoding.engine.captures) keeps those of its last positions:
    a
    reused prefix hands on the ones it covers, ending at its own last position."""
    kept = PrefixCache(ids=list(range(10)), features=torch.arange(4.0)[:, None], layers=(1,))  # positions 6 .. 9
    assert kept.reused_features(6) is None
    assert kept.reused_features(8).flatten().tolist() == [0.0, 1.0]  # positions 6 and 7
    assert kept.reused_features(10).flatten().tolist() == [0.0, 1.0, 2.0, 3.0]
    assert PrefixCache(ids=[1, 2]).reused_features(2) is None


def test_a_reused_prefix_with_features_for_its_last_positions_only_gives_the_same_reply():
    target = native_target()
    prompt = [5, 9, 12, 7, 30, 31, 2, 8, 4, 4]
    prefix = PrefixCache()
    reply, _ = run(target, prompt, prefix, FeatureRecorder())
    prefix.features = prefix.features[-3:]  # as if the reply had captured only its last three positions' features
    turn = prompt + reply + [3, 17, 21]
    recorder = FeatureRecorder()
    assert run(target, turn, prefix, recorder) == run(target, turn, drafter=FeatureRecorder())
    assert recorder.features[0].shape[0] == 3 + len(turn) - (len(prompt) + len(reply) - 1)  # kept + newly prefilled
