"""Distilling a draft: the collection plan and its labels, the training prompt sets, fitting
with validation, feature drafts trained from collected features, the model card."""

from __future__ import annotations

import pytest
import torch

from specdec_fast.data.prompts import heldout_prompts, policy_prompts, training_prompts
from specdec_fast.drafts.feature import FeatureDraft, load_feature_draft, save_feature_draft
from specdec_fast.training import collect, distill
from specdec_fast.training.card import write_card
from specdec_fast.training.collect import SHARD, TOP_K, InverseCdfSampling, TopKLabels, _generation_groups, _topk

from helpers.distribution import chi_square, sequence_counts
from helpers.models import PROMPT, exact_joint, tiny_llama


def test_prompt_sets_are_disjoint():
    """The draft trains on training_prompts, the policies on policy_prompts; the held-out set is neither."""
    training, policy = set(training_prompts()), set(policy_prompts())
    heldout = {p["prompt"] for p in heldout_prompts()}
    assert len(training) == len(training_prompts()) > 1000 and len(policy) == len(policy_prompts()) == 40
    assert len(heldout) == 34 and not (training & policy or training & heldout or policy & heldout)


def test_generation_groups_cover_each_missing_shard_once(tmp_path):
    """collect_generations' plan: every (response, shard) not yet stored exactly once, groups of at
    most batch // SHARD shards, greedy only for the first response of every fourth shard."""

    (tmp_path / "gen_r1_0002.pt").touch()
    groups = _generation_groups(tmp_path, num_prompts=5 * SHARD - 3, responses=2, batch=2 * SHARD)
    pairs = [pair for _, group in groups for pair in group]
    assert sorted(pairs) == sorted({(r, s) for r in range(2) for s in range(5)} - {(1, 2)})
    assert all(len(group) <= 2 for _, group in groups)
    assert all(greedy == (r == 0 and s % 4 == 0) for greedy, group in groups for r, s in group)


def test_inverse_cdf_sampling_in_greedy_generate_samples_the_target():
    """collect_generations' T = 1 sampling (greedy ``generate`` with InverseCdfSampling): the
    first two tokens of 6,000 batched responses follow the model's exact joint (chi-square), and
    the logits ``generate`` returns (the stored labels) are the model's raw ones, not the processed."""

    model = tiny_llama(5)
    vocab, runs = model.config.vocab_size, 6000
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT] * runs), attention_mask=torch.ones(runs, len(PROMPT), dtype=torch.int64),
                             max_new_tokens=2, do_sample=False, logits_processor=[InverseCdfSampling()], pad_token_id=0,
                             output_logits=True, return_dict_in_generate=True)
        raw = model(torch.tensor([PROMPT])).logits[0, -1]
    torch.testing.assert_close(out.logits[0], raw.expand(runs, -1))
    stat, threshold, _ = chi_square(sequence_counts(out.sequences[:, len(PROMPT):], vocab),
                                    exact_joint(model, PROMPT, 2, 1.0, 0, 1.0))
    assert stat < threshold, (stat, threshold)


@pytest.mark.parametrize("sampled", [False, True])
def test_topk_labels_are_those_of_the_raw_logits(sampled):
    """collect_generations' labels: TopKLabels, first among the processors, records at every step
    the top-k of the model's raw logits (what ``output_logits`` returns), also when a later
    processor (InverseCdfSampling) replaces the logits."""

    model = tiny_llama(6, vocab=TOP_K + 8)
    labels = TopKLabels()
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(torch.tensor([PROMPT] * 3), attention_mask=torch.ones(3, len(PROMPT), dtype=torch.int64),
                             max_new_tokens=4, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
                             logits_processor=[labels] + ([InverseCdfSampling()] if sampled else []))
    ids, logp = labels.labels()
    want_ids, want_logp = _topk(torch.stack(out.logits, 1))
    assert ids.shape == (3, 4, TOP_K)
    assert torch.equal(ids, want_ids) and torch.equal(logp, want_logp)


def test_corpus_prompts_are_excerpts_in_task_templates(monkeypatch, tmp_path):
    """corpus_prompts: per_source prompts of each corpus, interleaved, each one of its kind's task
    templates around an excerpt; their responses are stored under their own file prefix."""

    code = "\n".join(f"def f{i}(x):\n    return x + {i}\n" for i in range(40))
    texts = {"python": [code], "docs": ["A paragraph of plain words that explains a package. " * 4 + "\n\n<img src=x>"],
             "shakespeare": ["\n".join(f"Line {i} of a verse passage in the play." for i in range(60))],
             "bible": [". ".join(f"Verse number {i} says something" for i in range(30))]}
    monkeypatch.setattr(collect, "corpus_texts", lambda source: texts[source])
    prompts = collect.corpus_prompts(per_source=3)
    kinds = [next(s for s, tasks in collect.CORPUS_TASKS.items() if any(p.startswith(t.split("{}")[0]) for t in tasks))
             for p in prompts]
    assert len(prompts) == 10  # one docs paragraph passes the filter, 3 of each other corpus
    assert kinds[:4] == list(collect.CORPORA) and kinds.count("docs") == 1
    assert "def f0(x):" in prompts[2] and "<img" not in prompts[3]
    assert not set(prompts) & {p["prompt"] for p in heldout_prompts()}
    (tmp_path / "gen_corpus_r0_0000.pt").touch()
    assert collect._generation_groups(tmp_path, 10, 1, 16, "gen_corpus") == []
    assert collect._generation_groups(tmp_path, 10, 1, 16) == [(True, [(0, 0)])]


class TemplateCharTokenizer:
    """Characters as token ids (ord + 10; 1 = EOS) around a two-marker chat template."""

    eos_token_id = 1

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "<u>" + messages[0]["content"] + "<a>"

    def __call__(self, text, add_special_tokens):
        return type("Encoding", (), dict(input_ids=[ord(c) + 10 for c in text]))

    def decode(self, ids):
        return "".join(chr(t - 10) for t in ids)


class ScriptedWriter:
    """generate() returns the next scripted texts (each closed by EOS unless it ends with "..."),
    after the prefix it is given, and records the prefix and the seed it ran with."""

    def __init__(self, script: list[list[str]]):
        self.script, self.calls = list(script), []

    def generate(self, prefix, **kwargs):
        self.calls.append((TemplateCharTokenizer().decode(prefix[0].tolist()), torch.initial_seed()))
        rows = [[ord(c) + 10 for c in text] + ([] if text.endswith("...") else [1]) for text in self.script.pop(0)]
        width = max(map(len, rows))
        return torch.cat([prefix[: len(rows)], torch.tensor([row + [0] * (width - len(row)) for row in rows])], 1)


def test_self_prompts_keep_closed_new_ascii_requests_and_resume(tmp_path):
    """self_prompts samples after the template's opening of a user turn and keeps a request only
    when the turn closed, it is 20-500 ASCII characters and it is neither a repeat nor a held-out
    or policy prompt; the list and the number of seeded calls are stored, so a second call
    (a resumed run) returns the same list without generating, and a larger count continues."""

    heldout = heldout_prompts()[0]["prompt"]
    kept = ["Can you explain how rainbows form?", "Write a limerick about a sleepy cat."]
    script = [[kept[0], "Too short.", "An unfinished request that never closes...", heldout.upper(), "Qu'est-ce que c'est, ça ?"],
              [" can you EXPLAIN how rainbows   form?", kept[1], policy_prompts()[3], "x" * 501],
              ["Give me three facts about the moon, please."]]
    writer = ScriptedWriter(script)
    assert collect.self_prompts(writer, TemplateCharTokenizer(), tmp_path, count=2, batch=5) == kept
    assert [c[0] for c in writer.calls] == ["<u>", "<u>"] and [c[1] for c in writer.calls] == [0, 1]
    assert collect.self_prompts(ScriptedWriter([]), TemplateCharTokenizer(), tmp_path, count=2) == kept
    assert collect.self_prompts(writer, TemplateCharTokenizer(), tmp_path, count=3)[2] == script[2][0]
    assert writer.calls[-1][1] == 2


def test_fit_keeps_the_epoch_with_the_lowest_validation_loss(tmp_path):
    """validate_every=5 holds back every fifth sample; after each epoch the validation loss is
    taken, and training ends with the weights of the lowest-scoring epoch (here the second of
    three), also when resumed from its checkpoint."""

    torch.manual_seed(0)
    samples = [dict(x=torch.randn(3)) for _ in range(20)]
    training, validation = distill.split_validation(samples, 5)
    assert len(training) == 16 and len(validation) == 4 and not {id(s) for s in training} & {id(s) for s in validation}

    model = torch.nn.Linear(3, 1)
    snapshots, scores = [], iter([3.0, 1.0, 2.0])

    def loss_fn(rows):
        return (model(torch.stack([r["x"] for r in rows])) - 1).square().mean()

    def validation_loss(rows):
        assert all(any(r is v for v in validation) for r in rows)
        snapshots.append(model.weight.detach().clone())
        return torch.tensor(next(scores))

    fit = distill.FitConfig(epochs=3, batch=4, lr=0.1, validate_every=5)
    result = distill._fit(model, loss_fn, samples, tmp_path / "state.pt", fit, "test", dict(model="linear"), validation_loss)
    assert result == dict(steps=12, validation=[3.0, 1.0, 2.0], best_epoch=2)
    assert not torch.equal(snapshots[1], snapshots[2])
    assert torch.equal(model.weight, snapshots[1])
    model.weight.data.zero_()
    assert distill._fit(model, loss_fn, samples, tmp_path / "state.pt", fit, "test", dict(model="linear"),
                        validation_loss) == result
    assert torch.equal(model.weight, snapshots[1])
    with pytest.raises(ValueError, match=r"another run's training state .*'samples': \(20, 19\)"):
        distill._fit(model, loss_fn, samples[:19], tmp_path / "state.pt", fit, "test", dict(model="linear"), validation_loss)


def test_card_names_every_prompt_set_and_the_validation(tmp_path):
    """The model card describes the data of each prompt set collected and, when a validation
    split chose the epoch, its losses and the epoch kept."""

    info = dict(source_layer=29, num_layers=1, vocab_size=8192, coverage=0.95, samples=2816, label_positions=313_402, steps=1680,
                epochs=5, batch=8, lr=0.003, weight_decay=0.0, validate_every=20, validation=[2.5, 2.25, 2.375],
                best_epoch=2, responses={"templates": 3, "corpus": 3, "self": 1},
                prompts={"templates": 1616, "corpus": 1200, "self": 2000}, corpus_chunks=0, command="c")
    write_card(tmp_path / "card.md", "feature", "f.safetensors", info, {"T=0": 0.2, "T=1": 0.25}, 64, 17.9, "c")
    card = (tmp_path / "card.md").read_text()
    assert "to 1616 templated training prompts (`specdec_fast/data/prompts.py`), 3 each" in card
    assert "and to 1200 prompts built from excerpts" in card and "and to 2000 user requests written by the target" in card
    assert "313,402" in card and "every 20th collected sequence" in card
    assert "-> 1 decoder layer(s) in the target's architecture" in card
    assert "2.500, 2.250, 2.375; the weights of epoch 2 kept" in card
    assert "T=0 0.200, T=1 0.250" in card
    assert "Initialised" not in card and "Reproduce: `c`" in card


def test_card_reproduces_a_chain_of_warm_starts(tmp_path):
    """A draft started from one that was itself warm-started: the card gives every command, in order."""

    first = dict(command="one", label_positions="9", steps=7)
    second = dict(command="two", label_positions="9", steps=8, init=first)
    info = dict(source_layer=29, num_layers=1, vocab_size=8192, coverage=0.95, samples=2816, label_positions=9, steps=6, epochs=1,
                batch=8, lr=0.003, weight_decay=0.0, responses={"templates": 1}, prompts={"templates": 16}, corpus_chunks=0, init=second)
    write_card(tmp_path / "card.md", "feature", "f.safetensors", info, {"T=0": 0.2, "T=1": 0.25}, 64, 17.9, "three")
    card = (tmp_path / "card.md").read_text()
    assert "trained by `two` (9 labelled positions, 8 steps), itself initialised from one trained by `one` (9" in card
    assert "Reproduce: `one`, then `two`, then `three` (each `--init` = the previous command's output)" in card


def test_distilling_a_feature_draft_lowers_its_loss(tmp_path):
    """collect_features + train_feature on target continuations of random prompts: the trained
    draft fits the target's distributions better than the untrained one it started from."""

    target = tiny_llama(8, vocab=64, layers=2)
    g = torch.Generator().manual_seed(0)
    rows = []
    with torch.no_grad():
        for _ in range(16):
            ids = target.generate(torch.randint(0, 64, (1, 4), generator=g), max_new_tokens=12, do_sample=True,
                                  pad_token_id=0)[0]
            top_ids, top_logp = collect._topk(target(ids[None]).logits[0, 3:-1])
            rows.append(dict(ids=ids, start=3, top_ids=top_ids, top_logp=top_logp))
    torch.save(rows, tmp_path / "gen_r0_0000.pt")
    collect.collect_features(target, tmp_path)
    samples = distill.load_samples(tmp_path, ("feat_gen",))
    assert samples[0]["features"].shape == (len(rows[0]["ids"]) - 1, target.config.hidden_size)
    torch.manual_seed(0)
    info = distill.train_feature(target, tmp_path, tmp_path / "f.safetensors", vocab_size=48,
                                 fit=distill.FitConfig(epochs=20, batch=4, lr=3e-3))
    assert info["steps"] == 80
    with pytest.raises(ValueError, match=r"train_feature_state.pt holds another run's training state .*'epochs': \(20, 21\)"):
        distill.train_feature(target, tmp_path, tmp_path / "g.safetensors", vocab_size=48,
                              fit=distill.FitConfig(epochs=21, batch=4, lr=3e-3))
    trained = load_feature_draft(target, tmp_path / "f.safetensors")
    index = distill._restricted_index(trained.lm.lm_head.vocab_ids, 64)
    torch.manual_seed(0)
    untrained = FeatureDraft(target, trained.lm.lm_head.vocab_ids, trained.source_layer)
    with torch.no_grad():
        before, after = (distill.feature_loss(d, samples, index, torch.Generator().manual_seed(0)) for d in (untrained, trained))
    assert after < 0.9 * before


class ByteTokenizer:
    """Token ids = bytes modulo 64 (enough for corpus_chunks on a tiny target)."""

    def __call__(self, text: str):
        return type("Encoding", (), {"input_ids": [b % 64 for b in text.encode()]})()


def test_corpus_features_and_a_warm_start(tmp_path, monkeypatch):
    """collect_corpus(features=True) stores what collect_features computes for the same ids
    (final hidden states, top-k of the next token at every position); train_feature(init=...)
    starts from that draft (with a layer added), keeps its token subset, records its metadata,
    and lowers its loss."""

    target = tiny_llama(8, vocab=64, layers=2)
    texts = {"a": ["the quick brown fox jumps over the lazy dog. " * 8], "b": ["def f(x):\n    return x + 1\n" * 12]}
    monkeypatch.setattr(collect, "corpus_texts", lambda source: texts[source])
    collect.collect_corpus(target, ByteTokenizer(), tmp_path, ("a", "b"), chunks=8, chunk_len=24, batch=3, features=True)
    corpus = distill.load_samples(tmp_path, ("feat_corpus",))
    assert len(corpus) == 8 and all(len(s["ids"]) == 24 for s in corpus)
    torch.save([dict(ids=s["ids"], start=0, top_ids=s["top_ids"], top_logp=s["top_logp"]) for s in corpus[:3]],
               tmp_path / "gen_r0_0000.pt")
    collect.collect_features(target, tmp_path)
    for stored, recomputed in zip(corpus, distill.load_samples(tmp_path, ("feat_gen",))):
        torch.testing.assert_close(stored["features"], recomputed["features"], atol=2e-3, rtol=0)
        assert (stored["top_ids"] == recomputed["top_ids"]).float().mean() > 0.95
    (tmp_path / "feat_gen_r0_0000.pt").unlink()

    torch.manual_seed(0)
    first = FeatureDraft(target, torch.arange(0, 64, 2), source_layer=1)
    save_feature_draft(first, tmp_path / "init.safetensors", {"command": '"stage one"', "steps": "7", "label_positions": "9"})
    info = distill.train_feature(target, tmp_path, tmp_path / "f.safetensors", vocab_size=48,
                                 fit=distill.FitConfig(epochs=10, batch=4, lr=3e-3),
                                 init=tmp_path / "init.safetensors", command="stage two", num_layers=2)
    assert info["vocab_size"] == 32 and info["init"]["command"] == "stage one" and info["command"] == "stage two"
    trained = load_feature_draft(target, tmp_path / "f.safetensors")
    assert info["num_layers"] == 2 and len(trained.lm.model.layers) == 2
    assert trained.lm.model.layers[1].mlp.down_proj.weight.abs().sum() > 0  # the added layer was trained
    assert torch.equal(trained.lm.lm_head.vocab_ids, torch.arange(0, 64, 2))
    index = distill._restricted_index(trained.lm.lm_head.vocab_ids, 64)
    with torch.no_grad():
        before, after = (distill.feature_loss(d, corpus, index, torch.Generator().manual_seed(0)) for d in (first, trained))
    assert after < 0.9 * before
