"""The feature-level draft (specdec_fast/feature_draft.py): lossless and greedy-exact in the
loop, its cache equal to a from-scratch computation on true features after rollbacks,
the target adapter equal to the plain one, save/load, misuse."""

from __future__ import annotations

import pytest
import torch

from specdec_fast import HFCachedLM, fast_generate
from specdec_fast.drafts.binding import batched_pair
from specdec_fast.drafts.feature import deepened, load_feature_draft, save_feature_draft
from specdec_fast.drafts.feature_lm import DRAFT_PRECISION, FeatureDraftLM, LeanFeatureDraftLM, feature_pair
from specdec_fast.models.batched_lm import right_aligned
from specdec_fast.models.cached_lm import cache_argument
from specdec_fast.models.fast_passes import use_int8_weights

from helpers.distribution import chi_square, sequence_counts
from helpers.models import PROMPT, batched_samples, exact_joint, feature_draft, tiny_llama


@pytest.mark.slow
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 5, 0.8)])
def test_feature_draft_is_lossless(tiny_pair, temperature, top_k, top_p):
    """The joint of the first 3 tokens (k = 2: drafting from own features, rollback and recompute)
    is the target's, with a draft restricted to 5 of the 8 tokens: 4,000 runs through
    batch_generate's batched feature caches (helpers.models.batched_samples)."""
    target, _ = tiny_pair
    draft = feature_draft(target, torch.tensor([0, 1, 3, 4, 6]))
    seqs = batched_samples(target, draft, PROMPT, 3, 4000, num_draft_tokens=2, temperature=temperature, top_k=top_k,
                           top_p=top_p)
    stat, threshold, _ = chi_square(sequence_counts(seqs, 8), exact_joint(target, PROMPT, 3, temperature, top_k, top_p))
    assert stat < threshold


@pytest.mark.slow
def test_feature_pair_with_alternatives_is_lossless(tiny_pair):
    """One sequence's feature caches (feature_pair), with 2 first-token alternatives moved into place
    when accepted: the joint of the first 3 tokens over 4,000 fast_generate runs."""
    target, _ = tiny_pair
    t, d = feature_pair(target, feature_draft(target, torch.tensor([0, 1, 3, 4, 6])))
    seqs = torch.tensor([fast_generate(t, d, PROMPT, max_new_tokens=3, temperature=1.0, num_draft_tokens=2, num_alternatives=2, seed=s,
                                       eos_token_id=()).tokens for s in range(4000)])
    stat, threshold, _ = chi_square(sequence_counts(seqs, 8), exact_joint(target, PROMPT, 3, 1.0, 0, 1.0))
    assert stat < threshold


@pytest.mark.parametrize("alternatives", [0, 2])
@pytest.mark.parametrize("int8", [False, True])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_feature_draft_greedy_equals_target_greedy(k, int8, alternatives):
    target = tiny_llama(7, vocab=16, layers=3)
    draft = feature_draft(target)
    t, d = feature_pair(target, use_int8_weights(draft) if int8 else draft)
    out = fast_generate(t, d, PROMPT, max_new_tokens=30, temperature=0.0, num_draft_tokens=k,
                        num_alternatives=alternatives, eos_token_id=())
    own = fast_generate(target, target, PROMPT, max_new_tokens=30, temperature=0.0, num_draft_tokens=1, eos_token_id=())
    assert out.tokens == own.tokens
    assert out.stats.draft_calls > 0


def test_feature_pair_runs_the_draft_on_the_lean_path_beside_a_lean_target():
    """feature_pair's draft: on the lean path (int8 weights) beside a lean target, by transformers
    beside transformers' target or when its weights cannot take the path (int8 modules); the lean
    draft's logits stay within int8 error of transformers' fp32 draft on the same features."""
    target = tiny_llama(7, vocab=16, layers=3)
    draft = feature_draft(target)
    t, d = feature_pair(target, draft)
    assert type(d) is LeanFeatureDraftLM and d.lean.w.weights[0].dtype == torch.int8 and DRAFT_PRECISION == "int8"
    assert type(feature_pair(target, draft, lean="off")[1]) is FeatureDraftLM
    t.extend(torch.tensor(PROMPT), 1)
    lean = d.extend(torch.tensor(PROMPT), len(PROMPT))
    prev = torch.cat([torch.zeros(1, t.features.shape[1]), t.features[:-1]])
    with torch.no_grad():
        fp32 = draft.lm.lm_head(draft.features(torch.tensor([PROMPT]), prev[None]))[0]
    assert 0 < (lean - fp32).abs().max() < 0.05 * fp32.abs().max()
    assert type(feature_pair(target, use_int8_weights(draft))[1]) is FeatureDraftLM


def test_int8_feature_draft_stays_close_to_fp32():
    """use_int8_weights on a feature draft (fc, decoder layer, restricted head): the same
    features in, logits within quantization error of the fp32 draft's."""
    target = tiny_llama(7, vocab=16, layers=3)
    draft = feature_draft(target)
    ids, prev = torch.tensor([PROMPT]), torch.randn(1, len(PROMPT), target.config.hidden_size)
    with torch.no_grad():
        before = draft.lm.lm_head(draft.features(ids, prev))
        use_int8_weights(draft)
        after = draft.lm.lm_head(draft.features(ids, prev))
    assert draft.lm.lm_head.int8 is not None
    assert 0 < (after - before).abs().max() < 0.05 * before.abs().max()


@pytest.mark.parametrize("lean", [False, True])
@pytest.mark.parametrize("num_layers,alternatives", [(1, 0), (2, 0), (1, 3)])
def test_draft_cache_after_rollback_equals_from_scratch(tiny_pair, num_layers, alternatives, lean):
    """After a generation with rejections (and with alternatives, rounds that kept one), the
    target's features are those of the committed tokens and the draft's next-token logits equal
    the draft run from scratch on the committed tokens with the target's features of all of them,
    whether transformers or the lean path (at fp32, to compare) runs the draft's layers."""
    target, _ = tiny_pair
    draft = feature_draft(target, num_layers=num_layers)
    t, _ = feature_pair(target, draft)
    d = LeanFeatureDraftLM(draft, t, "fp32-dense") if lean else FeatureDraftLM(draft, t)
    out = fast_generate(t, d, PROMPT, max_new_tokens=24, temperature=1.0, num_draft_tokens=3, num_alternatives=alternatives, seed=0,
                        eos_token_id=(), guard=False)  # every round drafts
    assert out.stats.accepted < out.stats.drafted  # there were rejections
    assert out.stats.alternatives_accepted > 0 or not alternatives
    ids = torch.tensor(PROMPT + out.tokens)
    incremental = d.extend(ids[d.cache_length :], 1)[-1]
    assert d.true_length == len(ids)
    with torch.no_grad():
        h = target.model(input_ids=ids[None]).last_hidden_state[0]
        prev = torch.cat([torch.zeros(1, h.shape[1]), h[:-1]])
    torch.testing.assert_close(t.features, h[: t.cache_length], rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        scratch = draft.lm.lm_head(draft.features(ids[None], prev[None]))[0, -1]
    torch.testing.assert_close(incremental, scratch, rtol=1e-4, atol=1e-4)


def _loop_step_features(draft, ids: torch.Tensor, prev: torch.Tensor, first: int, steps: int) -> list[torch.Tensor]:
    """Features of draft steps 1..steps of a round whose first drafted position is ``first``,
    computed as the loop does: a cache of true-feature positions, then one position at a time
    from the draft's own last feature. ids [L], prev [L, d]."""
    from transformers import DynamicCache

    cache = {cache_argument(draft.lm.model): DynamicCache(config=draft.lm.config), "use_cache": True}
    f = draft.features(ids[None, : first + 1], prev[None, : first + 1], **cache)[0, -1]
    out = [f]
    for t in range(first + 1, first + steps):
        f = draft.features(ids[None, t : t + 1], f[None, None], **cache)[0, -1]
        out.append(f)
    return out


@pytest.mark.parametrize("num_layers", [1, 2])
def test_unrolled_features_equal_the_loops_steps(num_layers):
    """unrolled_features (one masked pass per step, right-padded batch) gives at every position
    what the loop computes for step j there: true features in the cache, own features after."""
    target = tiny_llama(7, vocab=16, layers=3)
    draft = feature_draft(target, num_layers=num_layers)
    d, lengths = target.config.hidden_size, (11, 8)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (2, 11), generator=g)
    prev = torch.randn(2, 11, d, generator=g)
    mask = torch.tensor([[1] * n + [0] * (11 - n) for n in lengths])
    with torch.no_grad():
        steps = draft.unrolled_features(ids, prev, 3, attention_mask=mask)
        for b, n in enumerate(lengths):
            for first in range(n - 2):
                for j, f in enumerate(_loop_step_features(draft, ids[b, :n], prev[b, :n], first, 3)):
                    torch.testing.assert_close(steps[j][b, first + j], f, rtol=1e-4, atol=1e-4)
        real = mask.bool()
        torch.testing.assert_close(steps[0][real], draft.features(ids, prev, attention_mask=mask)[real], rtol=1e-4, atol=1e-4)


def test_feature_target_logits_equal_plain_adapter(tiny_pair):
    target, _ = tiny_pair
    t, _ = feature_pair(target, feature_draft(target))
    plain = HFCachedLM(target)
    ids = torch.tensor(PROMPT + [2, 5, 7])
    torch.testing.assert_close(t.extend(ids[:4], 2), plain.extend(ids[:4], 2))
    torch.testing.assert_close(t.extend(ids[4:], 3), plain.extend(ids[4:], 3))
    assert t.features.shape == (7, target.config.hidden_size)
    t.crop(5)
    assert t.cache_length == 5


@pytest.mark.parametrize("num_layers", [1, 2])
def test_feature_draft_save_load_round_trip(tmp_path, num_layers):
    target = tiny_llama(3, vocab=16, layers=3)
    draft = feature_draft(target, torch.arange(0, 16, 2), num_layers=num_layers)
    path = tmp_path / "feature.safetensors"
    save_feature_draft(draft, path, {"note": "test"})
    loaded = load_feature_draft(target, path)
    ids, prev = torch.tensor([PROMPT]), torch.randn(1, len(PROMPT), target.config.hidden_size)
    with torch.no_grad():
        torch.testing.assert_close(draft.features(ids, prev), loaded.features(ids, prev), rtol=1e-2, atol=1e-2)
    assert loaded.lm.model.embed_tokens is target.get_input_embeddings()
    assert len(loaded.lm.model.layers) == num_layers


def test_deepened_draft_computes_what_the_draft_computes():
    """deepened adds layers that add nothing until trained: the same features (exactly), one
    more layer's parameters to train, and no shrinking."""
    target = tiny_llama(3, vocab=16, layers=3)
    draft = feature_draft(target)
    deeper = deepened(draft, target, 3)
    ids, prev = torch.tensor([PROMPT]), torch.randn(1, len(PROMPT), target.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(deeper.features(ids, prev), draft.features(ids, prev))
    assert len(deeper.lm.model.layers) == 3
    assert not torch.equal(deeper.lm.model.layers[2].mlp.up_proj.weight, torch.zeros_like(deeper.lm.model.layers[2].mlp.up_proj.weight))
    with pytest.raises(ValueError, match="cannot deepen a 3-layer draft to 2"):
        deepened(deeper, target, 2)


def test_draft_beyond_target_features_is_an_error(tiny_pair):
    target, _ = tiny_pair
    t, d = feature_pair(target, feature_draft(target))
    t.extend(torch.tensor(PROMPT[:2]), 1)
    with pytest.raises(ValueError, match="features of positions"):
        d.extend(torch.tensor(PROMPT), 1)


def test_batched_draft_beyond_target_features_is_an_error(tiny_pair):
    """A batch row may read its own last feature for one token beyond the target's cache, no more;
    a refused call changes nothing."""
    target, _ = tiny_pair
    t, d = batched_pair(target, feature_draft(target), 2)
    seq = [3, 1, 4, 1, 5, 2, 6]
    t.extend(*right_aligned([seq[:2], seq[:3]]), 1)
    with pytest.raises(ValueError, match="row 0: the target's features of positions 2..2 are not known"):
        d.extend(*right_aligned([seq[:4], seq[:3]]), 1)  # row 0: no own feature yet
    assert d.valid.shape[1] == 0  # the refused call left the cache as it was
    d.extend(*right_aligned([seq[:3], seq[:4]]), 1)  # true features only
    d.extend(*right_aligned([seq[3:4], seq[4:5]]), 1)  # one token each, from own features
    with pytest.raises(ValueError, match="row 1: the target's features of positions 3..5 are not known"):
        d.extend(*right_aligned([seq[4:5], seq[5:7]]), 1)








def feature_pair_checks(device: torch.device) -> None:
    """The feature pair with first-token alternatives on ``device``: greedy output equals the
    target's own (transformers' generate), and the first two tokens' joint at T = 1 is exact."""
    target = tiny_llama(0).to(device)
    t, d = feature_pair(target, feature_draft(target).to(device))
    ids = torch.tensor([PROMPT], device=device)
    hf = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False, pad_token_id=0)
    greedy = fast_generate(t, d, PROMPT, max_new_tokens=20, temperature=0.0, num_draft_tokens=3, num_alternatives=2,
                           eos_token_id=())
    assert greedy.tokens == hf[0, len(PROMPT):].tolist() and greedy.stats.alternatives > 0
    seqs = torch.tensor([fast_generate(t, d, PROMPT, max_new_tokens=2, temperature=1.0, num_draft_tokens=2,
                                       num_alternatives=2, seed=s, eos_token_id=()).tokens for s in range(2000)])
    stat, threshold, df = chi_square(sequence_counts(seqs, 8), exact_joint(target.cpu(), PROMPT, 2, 1.0, 0, 1.0))
    assert stat < threshold, f"chi2 {stat:.1f} > {threshold:.1f} (df {df})"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: the feature pair with its caches on it")
def test_on_cuda_feature_pair_with_alternatives():
    feature_pair_checks(torch.device("cuda"))
