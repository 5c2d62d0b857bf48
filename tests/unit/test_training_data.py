"""Prefix-tuning examples: code prompt without loss, document tokens with the privacy mask, padding."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from ctrlgen.errors import ConfigError
from ctrlgen.models import tiny_tokenizer
from ctrlgen.prompts import prefix_prompt
from ctrlgen.training.data import collate, encode_example, encode_rows

TEXT = "Mr. Smith was seen at Mercy Hospital on 2101-03-04."
SMITH = (TEXT.index("Smith"), TEXT.index("Smith") + 5)
MERCY = (TEXT.index("Mercy"), TEXT.index("Hospital") + 8)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def test_the_code_prompt_takes_no_loss_and_the_document_does(tok):
    ex = encode_example("PERSON: Smith", TEXT, [SMITH], tok, max_doc_tokens=512)
    prompt = tok(prefix_prompt("PERSON: Smith"), add_special_tokens=False)["input_ids"]
    doc = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert ex.input_ids == prompt + doc + [tok.eos_token_id]
    assert ex.labels == [-100] * len(prompt) + doc + [tok.eos_token_id]
    assert not any(ex.private[: len(prompt)]) and not ex.private[-1]  # prompt and EOS are never private


def test_private_flags_are_exactly_the_tokens_overlapping_entity_spans(tok):
    ex = encode_example("PERSON: Smith", TEXT, [SMITH, MERCY], tok, max_doc_tokens=512)
    n_prompt = ex.labels.count(-100)
    enc = tok(TEXT, add_special_tokens=False, return_offsets_mapping=True)
    for flag, (s, e) in zip(ex.private[n_prompt:], enc["offset_mapping"], strict=False):
        overlaps = any(s < pe and ps < e for ps, pe in (SMITH, MERCY))
        assert flag == overlaps, (s, e, TEXT[s:e])
    private_text = "".join(
        TEXT[s:e] for f, (s, e) in zip(ex.private[n_prompt:], enc["offset_mapping"], strict=False) if f
    )
    assert "Smith" in private_text and "Mercy" in private_text and "seen" not in private_text


def test_a_cut_document_gets_no_eos(tok):
    ex = encode_example("", TEXT, [], tok, max_doc_tokens=3)
    assert ex.labels.count(-100) + 3 == len(ex.labels) and tok.eos_token_id not in ex.labels


def test_collate_pads_on_the_right_without_loss_or_privacy(tok):
    a = encode_example("PERSON: Smith", TEXT, [SMITH], tok, 512)
    b = encode_example("", "Short.", [], tok, 512)
    batch = collate([a.input_ids, b.input_ids], [a.labels, b.labels], [a.private, b.private], pad_token_id=0)
    n = len(b.input_ids)
    assert batch["input_ids"].shape == (2, len(a.input_ids))
    assert batch["attention_mask"][1, :n].all() and not batch["attention_mask"][1, n:].any()
    assert (batch["labels"][1, n:] == -100).all() and not batch["private"][1, n:].any()
    assert batch["private"][0].tolist() == a.private
    with pytest.raises(ValueError, match="differ in length"):
        collate([a.input_ids], [a.labels[:-1]], [a.private], 0)


def test_encode_rows_quarantines_bad_rows_and_never_drops_one(tok):
    ent = {"start": SMITH[0], "end": SMITH[1]}
    rows = [
        {
            "doc_id": "ok",
            "text": TEXT,
            "entities": [ent],
            "control_code": "PERSON: Smith",
            "metadata": '{"corpus": "physionet-deid", "patient": "17", "note": "2"}',
        },
        {"doc_id": "empty", "text": "  ", "entities": [], "control_code": ""},
        {"doc_id": "span", "text": "abc", "entities": [{"start": 1, "end": 9}], "control_code": ""},
        {"doc_id": "long", "text": TEXT, "entities": [], "control_code": "PERSON: " + "x " * 400},
    ]
    table = encode_rows(rows, tok, max_doc_tokens=64, max_code_tokens=64).to_pylist()
    assert [r["doc_id"] for r in table] == ["ok", "empty", "span", "long"]
    status = {r["doc_id"]: (r["status"], r["reason"]) for r in table}
    assert status["ok"] == ("ok", "")
    assert status["empty"] == ("quarantined", "empty document")
    assert "outside the text" in status["span"][1] and "max_code_tokens" in status["long"][1]
    ok = table[0]
    assert ok["control_code"] == "PERSON: Smith" and ok["n_private"] == sum(ok["private"]) > 0
    assert ok["patient"] == "17" and table[3]["patient"] is None  # the DP privacy unit; none without metadata
    assert ok["n_output"] == sum(v != -100 for v in ok["labels"])
    # Reasons never quote the document.
    assert all("Smith" not in r["reason"] for r in table)


def test_padding_takes_no_loss(tok):
    """An example's loss is the same alone and padded inside a batch (sum reduction)."""
    from ctrlgen.models import tiny_llama
    from ctrlgen.training import LossWeights
    from ctrlgen.training.prefix import batch_loss, prefix_model

    torch.manual_seed(0)
    model = prefix_model(tiny_llama()[0], num_virtual_tokens=4)
    a = encode_example("PERSON: Smith", TEXT, [SMITH], tok, 512)
    b = encode_example("", "Short.", [], tok, 512)
    both = collate([a.input_ids, b.input_ids], [a.labels, b.labels], [a.private, b.private], 0)
    alone = collate([b.input_ids], [b.labels], [b.private], 0)
    first = collate([a.input_ids], [a.labels], [a.private], 0)
    w = LossWeights()
    with torch.no_grad():
        t_both = batch_loss(model, both, w, "sum")
        t_sum = [batch_loss(model, x, w, "sum") for x in (first, alone)]
    assert t_both.tokens == sum(t.tokens for t in t_sum)
    for name in ("lm", "contrastive", "kl"):
        expect = sum(float(getattr(t, name)) for t in t_sum)
        assert float(getattr(t_both, name)) == pytest.approx(expect, rel=1e-4, abs=1e-5)


def test_deepspeed_config_fills_auto_and_refuses_an_optimizer(tmp_path):
    from ray_jobs.train import deepspeed_config

    ds = deepspeed_config("configs/deepspeed/zero2.json", batch_size=4, world_size=2)
    assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["train_batch_size"] == 8
    assert ds["zero_optimization"]["stage"] == 2
    bad = tmp_path / "opt.json"
    bad.write_text(json.dumps({"optimizer": {"type": "Adam"}}))
    with pytest.raises(ConfigError, match="declares an optimizer"):
        deepspeed_config(str(bad), 4, 2)
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        deepspeed_config(str(tmp_path / "broken.json"), 4, 2)
    with pytest.raises(ConfigError, match="does not exist"):
        deepspeed_config(str(tmp_path / "none.json"), 4, 2)


def test_resuming_a_run_with_other_examples_is_refused(tmp_path):
    """A run's checkpoints were trained on its examples: a config making others must not resume them."""
    from ctrlgen.config import load_config
    from ctrlgen.errors import CtrlgenError
    from ray_jobs.train import _MANIFEST, _manifest, run

    cfg = load_config("configs/train_tiny.yaml", [f"output_dir={tmp_path}"])
    (tmp_path / "ray_train" / "prefix").mkdir(parents=True)  # an existing run
    (tmp_path / "train_data").mkdir()
    other = load_config("configs/train_tiny.yaml", [f"output_dir={tmp_path}", "training.max_doc_tokens=64"])
    (tmp_path / "train_data" / _MANIFEST).write_text(json.dumps(_manifest(other)))
    with pytest.raises(CtrlgenError, match="trained on other examples"):
        run(cfg)


def test_rank_shards_are_disjoint_contiguous_and_read_only_their_row_groups(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.training.data import IngestCount, example_layout, rank_batches, rank_range

    files = []
    for k, (start, n) in enumerate([(0, 40), (40, 24)]):  # 64 examples, row groups of 8
        ids = [[i, i] for i in range(start, start + n)]
        table = pa.table({"input_ids": ids, "labels": ids, "private": [[False, True]] * n})
        pq.write_table(table, tmp_path / f"examples-{k}.parquet", row_group_size=8)
        files.append(str(tmp_path / f"examples-{k}.parquet"))
    layout = example_layout(files)
    assert layout == [(files[0], [8] * 5), (files[1], [8] * 3)]
    cols = ("input_ids", "labels", "private")
    seen, counts = [], []
    for rank in range(2):  # 2 workers x 7 batches of 4 (drop the last 8 examples, as steps_per_epoch does)
        lo, hi = rank_range(rank, 7, 4)
        count = IngestCount()
        rows = [x[0] for b in rank_batches(layout, lo, hi, 4, cols, count) for x in b["input_ids"]]
        assert rows == list(range(rank * 28, rank * 28 + 28))
        seen += rows
        counts.append(count)
    assert seen == list(range(56))
    assert [c.rows for c in counts] == [32, 32]  # 28 rows each, read in whole row groups of 8
    assert all(c.bytes > 0 for c in counts)
    lo, hi = rank_range(1, 7, 4, skip_batches=5)  # a resumed epoch: batches 6 and 7 of rank 1 only
    count = IngestCount()
    rest = [x[0] for b in rank_batches(layout, lo, hi, 4, cols, count) for x in b["input_ids"]]
    assert rest == list(range(48, 56)) and count.rows == 8


def test_example_files_that_changed_since_they_were_counted_are_refused(tmp_path):
    """A resumed run trains on the examples its counts file recorded: a file gone from storage since is an error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.errors import CtrlgenError
    from ctrlgen.training.data import example_layout
    from ray_jobs.train import _check_layout

    files = []
    for k in range(2):
        pq.write_table(pa.table({"input_ids": [[1, 2]] * 12}), tmp_path / f"examples-{k}.parquet", row_group_size=8)
        files.append(str(tmp_path / f"examples-{k}.parquet"))
    _check_layout(example_layout(files), 24, str(tmp_path))
    with pytest.raises(CtrlgenError, match="holds 12 examples but 24 were written"):
        _check_layout(example_layout(files[:1]), 24, str(tmp_path))


def test_read_rows_takes_scattered_rows_from_only_their_row_groups(tmp_path):
    """A DP worker's notes (its patients') lie anywhere in the training order: read_rows returns exactly them,
    in order, opening only the row groups that hold one."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.training.data import IngestCount, example_layout, read_rows

    files = []
    for k, (start, n) in enumerate([(0, 40), (40, 24)]):  # 64 examples, row groups of 8
        ids = [[i, i] for i in range(start, start + n)]
        pq.write_table(pa.table({"input_ids": ids, "patient": [str(i % 5) for i in range(start, start + n)]}),
                       tmp_path / f"examples-{k}.parquet", row_group_size=8)  # fmt: skip
        files.append(str(tmp_path / f"examples-{k}.parquet"))
    layout = example_layout(files)
    count = IngestCount()
    want = [1, 3, 7, 41, 42, 63]  # row groups 0, 5 and 7 of 8
    got = read_rows(layout, want, ("input_ids", "patient"), count)
    assert [x[0] for x in got["input_ids"]] == want and got["patient"] == [str(i % 5) for i in want]
    assert count.rows == 24
    assert read_rows(layout, [], ("input_ids",)) == {"input_ids": []}
    arrays = read_rows(layout, want, ("input_ids", "patient"), as_arrays=True)  # a DP worker's share
    assert [list(x) for x in arrays["input_ids"]] == [[i, i] for i in want] and arrays["patient"] == got["patient"]
    assert isinstance(arrays["input_ids"][0], np.ndarray) and len(arrays["input_ids"]) == len(want)
    assert [list(x) for x in arrays["input_ids"][-2:]] == [[42, 42], [63, 63]]
    with pytest.raises(IndexError):
        arrays["input_ids"][len(want)]
    from ctrlgen.training.data import collate

    as_lists = collate(got["input_ids"][:3], got["input_ids"][:3], [[True, False]] * 3, 0)
    as_arrays = collate(arrays["input_ids"][:3], arrays["input_ids"][:3], [np.array([True, False])] * 3, 0)
    assert all(bool((as_lists[k] == as_arrays[k]).all()) for k in as_lists)
    with pytest.raises(ValueError, match="2 rows asked, 1 found"):
        read_rows(layout, [5, 64], ("input_ids",))


def test_epoch_batches_reshuffle_every_epoch_cover_each_example_once_and_resume_exactly(tmp_path):
    """Each epoch: every example once, by one rank; ranks take another slice and the rows another order each
    epoch; the same seed gives the same batches, and a resumed epoch continues them without reading what it skips."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.training.data import IngestCount, epoch_batches, example_layout

    pq.write_table(pa.table({"input_ids": [[i] for i in range(100)]}), tmp_path / "e.parquet", row_group_size=8)
    layout = example_layout([str(tmp_path / "e.parquet")])
    world, steps, bs = 2, 12, 4  # 96 of the 100 examples per epoch (the last incomplete round is dropped)

    def epoch(rank: int, e: int, seed: int = 0, skip: int = 0, count: IngestCount | None = None) -> list[list[int]]:
        return [[x[0] for x in b["input_ids"]]
                for b in epoch_batches(layout, rank, world, steps, bs, e, seed, ("input_ids",), skip, count,
                                       window=2)]  # fmt: skip

    runs = {(r, e): epoch(r, e) for r in range(world) for e in range(3)}
    for e in range(3):
        rows = [x for r in range(world) for b in runs[(r, e)] for x in b]
        assert sorted(rows) == list(range(96)) and all(len(runs[(r, e)]) == steps for r in range(world))
    assert {x for b in runs[(0, 0)] for x in b} == {x for b in runs[(1, 1)] for x in b}  # slices rotate
    assert {x for b in runs[(0, 0)] for x in b} != {x for b in runs[(0, 1)] for x in b}
    assert runs[(0, 0)] != runs[(0, 2)] and runs[(0, 0)] == epoch(0, 0)  # reshuffled per epoch, seeded
    assert epoch(0, 0, seed=1) != runs[(0, 0)]
    count = IngestCount()
    assert epoch(1, 2, skip=5, count=count) == runs[(1, 2)][5:]  # a resumed epoch: the same batches after the 5th
    assert count.rows < 48  # the skipped windows were not read
