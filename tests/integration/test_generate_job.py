"""The Ray Data ICL generation job on a local Ray cluster started by the test (tiny model)."""

import pytest

from ctrlgen.generation.report import read_generated
from ctrlgen.metrics.leakage import leaked_values

pytestmark = pytest.mark.integration


def test_generation_job_on_the_shared_clinical_notes(ray_cluster, tmp_path, shared, capsys):
    from ctrlgen.cli import main

    overrides = [f"output_dir={tmp_path}", f"corpus.path={shared / 'physionet-deid'}"]
    assert main(["generate", "-c", "configs/generate_tiny.yaml", *overrides]) == 0
    printed = capsys.readouterr().out
    assert "targets 6 x modes -> rows 18" in printed and "| icl_blocking |" in printed
    rows = read_generated(tmp_path / "generated")
    assert len(rows) == 18 and {r["mode"] for r in rows} == {"baseline", "icl", "icl_blocking"}
    assert all(r["status"] == "ok" for r in rows)
    by_doc = {}
    for r in rows:
        by_doc.setdefault(r["doc_id"], {})[r["mode"]] = r
    for modes in by_doc.values():
        assert len({tuple(m["context_ids"]) for m in modes.values()}) == 1
        # The fictional code never reuses a real value of the contexts.
        fake = modes["icl"]["fictional_code"]
        assert fake and not leaked_values(fake, modes["icl"]["context_values"])
    for r in rows:
        if r["mode"] == "icl_blocking" and r["released"]:
            assert not leaked_values(r["text"], r["context_values"])
    # Same config, same seed: the same synthetic notes (per-row seeds, no dependence on scheduling).
    assert main(["generate", "-c", "configs/generate_tiny.yaml", *overrides, f"output_dir={tmp_path / 'again'}",
                 f"generation.input={tmp_path / 'extracted'}"]) == 0  # fmt: skip
    again = {(r["doc_id"], r["mode"]): r["text"] for r in read_generated(tmp_path / "again" / "generated")}
    assert again == {(r["doc_id"], r["mode"]): r["text"] for r in rows}
    # The semantic attack of this output by the real notes (ray_jobs.semantic, `ctrlgen semantic-attack`):
    # every output is made from its 3 contexts, so the notes used as contexts are the linkable records.
    assert main(["semantic-attack", "-c", "configs/generate_tiny.yaml", *overrides, "experiment.test_documents=8"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("semantic attack:"))
    import re

    correct, linkable = map(int, re.search(r"correct linkage (\d+)/(\d+) linkable", line).groups())
    assert 0 < linkable <= len({c for r in rows for c in r["context_ids"]}) and 0 <= correct <= linkable


def test_generation_job_reports_a_missing_input(ray_cluster, tmp_path, capsys):
    from ctrlgen.cli import main

    code = main(["generate", "-c", "configs/generate_tiny.yaml", f"generation.input={tmp_path / 'none'}"])
    assert code == 2 and "holds no Parquet files" in capsys.readouterr().err


def test_distributed_leakage_scoring_equals_the_local_metric(ray_cluster, tmp_path):
    """score_output (per-row terms in actors, sums and distinct values by Ray Data groupby) gives the
    figures of leakage_by_mode on the driver, on rows that do leak, ICL and fine-tuning modes, with
    quarantined, withheld and retried rows, spread over several files."""
    import dataclasses
    import json
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.config import load_config
    from ctrlgen.generation.icl import GENERATED_SCHEMA
    from ctrlgen.generation.report import leakage_by_mode
    from ray_jobs.generate import score_output

    rng = random.Random(7)
    names = ["Ann Lee", "Bo Chen", "Cy Park", "Di Ross", "Ed Moss", "Fay Wu", "Gus Roe", "Hal Poe"]
    finetune = names[:6]
    rows = []
    for mode in ("icl", "icl_blocking", "prefix"):
        for i in range(60):
            ctx = rng.sample(names, 3) if mode != "prefix" else []
            pool = finetune if mode == "prefix" else ctx
            said = rng.sample(names, rng.randint(0, 2))
            text = f"Seen {' and '.join(said)} on day {i}."
            first = sorted(v.casefold() for v in rng.sample(pool, rng.randint(0, 2)))
            ok = rng.random() > 0.1
            rows.append({
                "doc_id": f"d{i:03d}", "mode": mode, "context_ids": ["c1"], "fictional_code": "PERSON: X",
                "text": text if ok else "", "context_values": ctx, "leaked_first": first if ok else [],
                "leaked": [], "attempts": rng.randint(1, 3) if ok else 0, "released": ok and rng.random() > 0.3,
                "new_tokens": 5, "finish": "length", "status": "ok" if ok else "quarantined", "reason": "",
            })  # fmt: skip
    out = tmp_path / "generated"
    table = pa.Table.from_pylist(rows, schema=GENERATED_SCHEMA)
    for mode in ("icl", "icl_blocking", "prefix"):
        part = table.filter(pa.compute.equal(table.column("mode"), mode)).drop_columns(["mode"])
        (out / f"mode={mode}").mkdir(parents=True)
        for k in range(3):
            pq.write_table(part.slice(20 * k, 20), out / f"mode={mode}" / f"p{k}.parquet")
    cfg = load_config("configs/generate_tiny.yaml", ["generation.modes=[icl,icl_blocking,prefix]"])
    summary = score_output(cfg, str(out), finetune, targets=60)
    local = leakage_by_mode(rows, finetune)
    assert [s.mode for s in summary.by_mode] == [s.mode for s in local] == ["icl", "icl_blocking", "prefix"]
    for got, want in zip(summary.by_mode, local, strict=True):
        assert dataclasses.asdict(got) == pytest.approx(dataclasses.asdict(want), abs=1e-12)
    assert any(s.pipp_released > 0 for s in local) and local[2].elp_first > 0  # the case does leak
    assert json.loads((out / "leakage.json").read_text())[2]["mode"] == "prefix"
    with pytest.raises(Exception, match="61 targets x 3 modes but rows per mode icl 60"):
        score_output(cfg, str(out), finetune, targets=61)


def test_seeded_top_k_is_exact_and_keeps_rows_in_the_cluster(ray_cluster):
    """The seeded sample is the k smallest hashes of everything, whatever the blocks; the dataset
    form filters by a threshold found from hashes alone (k of them on the driver)."""
    import ray

    from ctrlgen.generation.icl import row_seed
    from ray_jobs.common import sample_threshold, seeded_sample, seeded_sample_ds

    ids = [f"doc{i}" for i in range(3000)]
    ds = ray.data.from_items([{"doc_id": d, "text": "t" + d} for d in ids], override_num_blocks=7)
    for k in (1, 10, 999, 3000, 4000):
        want = sorted(ids, key=lambda d: row_seed(3, "x", d))[:k]
        assert [r["doc_id"] for r in seeded_sample(ds, k, 3, "x", ["doc_id"])] == want
        assert sorted(r["doc_id"] for r in seeded_sample_ds(ds, k, 3, "x").take_all()) == sorted(want)
    assert sample_threshold(ds, 3000, 3, "x") == max(row_seed(3, "x", d) for d in ids)
    assert sample_threshold(ds, 3001, 3, "x") is None


def test_sampled_targets_make_the_same_batches_whatever_the_input_layout(ray_cluster, tmp_path):
    """What generation does with sampled targets (key order, ordered execution, strict blocks) gives
    every actor batch the same rows from two file layouts of the same rows, as an unknown-setting
    extraction's output differs run to run; Ray Data's default order gives different batches."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray

    from ray_jobs.common import even_pool, ordered_execution, sample_in_key_order, seeded_sample_ds

    class BatchIds:  # defined here: pickled by value to the workers
        """An actor that reports which rows each batch it gets holds."""

        def __call__(self, batch: pa.Table) -> pa.Table:
            return pa.table({"ids": [",".join(batch.column("doc_id").to_pylist())]})

    ids = [f"doc{i:03}" for i in range(240)]
    for name, seed, files in (("a", 1, 3), ("b", 2, 7)):  # other row orders and file cuts
        rows = ids[:]
        random.Random(seed).shuffle(rows)
        (tmp_path / name).mkdir()
        for f in range(files):
            part = rows[f::files]
            pq.write_table(pa.table({"doc_id": part, "text": ["t"] * len(part)}), tmp_path / name / f"{f}.parquet")

    def batches(name: str, ordered: bool) -> list[str]:
        with ordered_execution(ordered):
            ds = ray.data.read_parquet(str(tmp_path / name))
            if ordered:
                ds = sample_in_key_order(ds, 100, 5, "targets", ["doc_id"])
            else:
                ds = seeded_sample_ds(ds, 100, 5, "targets")
            out = ds.repartition(target_num_rows_per_block=16, strict=ordered).map_batches(
                BatchIds, batch_size=16, batch_format="pyarrow", compute=even_pool(2)
            )
            return sorted(r["ids"] for r in out.take_all())

    ordered, default = batches("a", True), batches("a", False)
    assert len(ordered) == 7 and ordered == batches("b", True)
    rows_of = lambda bs: sorted(x for b in bs for x in b.split(","))  # noqa: E731
    assert rows_of(ordered) == rows_of(default)  # the same 100 rows either way
    assert default != batches("b", False)  # without it the batches differ: the test can fail


def test_llm_anonymiser_job_keeps_every_note_and_releases_no_known_value(ray_cluster, tmp_path, shared, capsys):
    """``ctrlgen anonymize``: the Ray Data job over an extraction output (tiny model; plumbing, counts, the
    known values kept out by blocking and the redaction fallback)."""
    import json

    import pyarrow.dataset as pads

    from ctrlgen.cli import main

    overrides = [f"output_dir={tmp_path}", f"corpus.path={shared / 'physionet-deid'}", "anonymizer.num_documents=5",
                 "anonymizer.rounds=2", "anonymizer.chunk_chars=300", "anonymizer.sampling.max_new_tokens=24",
                 "anonymizer.attack_max_new_tokens=8", "anonymizer.actor_num_cpus=0.5", "anonymizer.torch_threads=1"]  # fmt: skip
    assert main(["anonymize", "-c", "configs/generate_tiny.yaml", *overrides]) == 0
    assert "anonymize: 5 notes ->" in capsys.readouterr().out
    out = tmp_path / "anonymized"
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["notes"] == 5 and sum(summary["by_status"].values()) == 5
    rows = pads.dataset(out, format="parquet", partitioning="hive").to_table().to_pylist()
    ext = {r["doc_id"]: r for r in pads.dataset(tmp_path / "extracted" / "status=ok", format="parquet")
           .to_table(columns=["doc_id", "entities"]).to_pylist()}  # fmt: skip
    assert len(rows) == 5 and all(r["status"] in ("private", "redacted") for r in rows)
    for r in rows:
        values = [e["text"] for e in ext[r["doc_id"]]["entities"]]
        assert r["text"] and not leaked_values(r["text"], values)
        assert (1 <= r["rounds"] <= 2) if values else r["rounds"] == 0  # a note without PHI is kept as it is
