"""Prefix tuning on Ray Train + DeepSpeed ZeRO-2 (2 CPU workers, gloo), resume, adapter, prefix generation.

Tiny random Llama on a slice of the PhysioNet notes (configs/train_tiny.yaml), on a
local Ray cluster started by the test.
"""

import json
import os
import statistics

import pytest
import torch

from ctrlgen.generation.report import read_generated

pytestmark = pytest.mark.integration

CONFIG = "configs/train_tiny.yaml"


def _adapter(path):
    from safetensors.torch import load_file

    return load_file(str(path / "adapter" / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def trained(ray_cluster, tmp_path_factory, shared):
    """One run of the tiny config (2 workers, 4 steps), shared: its adapter, its printed summary, and its
    extraction output, which the other runs of this module train on (`training.input`) instead of extracting
    again. Tests read it; only the two-worker test writes into it (its generation, `<run>/generated`, which no
    other test reads)."""
    import contextlib
    import glob
    import io
    import tempfile

    from ctrlgen.cli import main

    staged = os.path.join(tempfile.gettempdir(), "ctrlgen-ckpt-*")  # where the workers stage checkpoints
    before = set(glob.glob(staged))
    out = tmp_path_factory.mktemp("trained") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["train", "-c", CONFIG, f"output_dir={out}", f"corpus.path={shared / 'physionet-deid'}"]) == 0
    assert set(glob.glob(staged)) <= before  # staged checkpoints are gone once reported
    return out, printed.getvalue()


def _input(trained):
    return f"training.input={trained[0] / 'extracted'}"


def test_train_two_workers_then_generate_from_the_prefix(trained, tmp_path, shared, capsys):
    from peft import PeftModel

    from ctrlgen.cli import main
    from ctrlgen.models import tiny_llama

    out, printed = trained
    overrides = [f"output_dir={out}", f"corpus.path={shared / 'physionet-deid'}"]
    assert "documents 32 -> examples 32 (quarantined 0)" in printed and "steps 4 (resumed from 0)" in printed
    history = [json.loads(x) for x in (out / "training" / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    for h in history:  # every loss term, throughput and step time are reported
        assert h["lm"] > 0 and h["contrastive"] >= 0 and h["kl"] >= 0 and h["tokens_per_s"] > 0
        assert h["output_tokens"] > h["private_tokens"] >= 0
    assert sum(h["private_tokens"] for h in history) > 0  # (a step whose 8 notes hold no PHI has none)
    # Standard PEFT format, loadable on top of the base model.
    tuned = PeftModel.from_pretrained(tiny_llama()[0], str(out / "adapter"))
    assert tuned.peft_config["default"].num_virtual_tokens == 20
    assert (out / "train_data" / "status=ok").is_dir()

    assert main(["generate", "-c", CONFIG, *overrides, f"generation.input={out / 'extracted'}"]) == 0
    printed = capsys.readouterr().out
    assert "targets 6 x modes -> rows 6" in printed and "| prefix | 6 | 0 |" in printed
    rows = read_generated(out / "generated")
    assert {r["mode"] for r in rows} == {"prefix"} and all(r["status"] == "ok" for r in rows)
    assert all(r["fictional_code"] and r["new_tokens"] > 0 for r in rows)

    # The experiment's generation stage (ray_jobs.generate_cells): this prefix cell and an ICL cell of another seed
    # in one job, their rows sharing batches: the prefix cell's rows are the generation job's, text for text.
    from ctrlgen.config import load_config
    from ray_jobs.generate_cells import Cell, generate_cells

    cfg = load_config(CONFIG, [*overrides, "generation.max_context_tokens=64"])  # 3 contexts fit the tiny model
    ext, g = str(out / "extracted"), cfg.generation
    cells = [
        Cell("prefix", str(tmp_path / "cells" / "prefix"), g.seed, ("prefix",), ext, ext, 6, str(out / "adapter"),
             str(out / "train_data")),
        Cell("icl", str(tmp_path / "cells" / "icl"), g.seed + 5, ("icl", "icl_blocking"), ext, ext, 3),
    ]  # fmt: skip
    assert generate_cells(cfg, cells) == {"prefix": 6, "icl": 6}
    texts = {(r["doc_id"], r["fictional_code"]): r["text"] for r in rows}
    assert {(r["doc_id"], r["fictional_code"]): r["text"] for r in read_generated(cells[0].output)} == texts
    icl = read_generated(cells[1].output)
    assert {r["mode"] for r in icl} == {"icl", "icl_blocking"}
    assert all(r["status"] == "ok" and len(r["context_ids"]) == 3 for r in icl)
    # A re-run with resume skips both written cells (their fingerprints hold).
    assert generate_cells(cfg, cells, resume=True) == {"prefix": 0, "icl": 0}


def test_stopped_run_resumes_from_its_checkpoint_exactly(trained, tmp_path, shared, capsys):
    """2 workers, 2 steps, stop; rerun to 4: it continues at step 3 and ends where an uninterrupted run (the
    shared 4-step run) ends.

    Exact: the prefix, the AdamW moments and the step are restored, and the data order is fixed
    (every worker reads its own contiguous share of the examples, in file order).
    """
    from ctrlgen.cli import main

    common = [f"corpus.path={shared / 'physionet-deid'}"]
    straight, stopped = trained[0], tmp_path / "stopped"
    extracted = _input(trained)
    assert main(["train", "-c", CONFIG, *common, extracted, f"output_dir={stopped}", "training.max_steps=2"]) == 0
    first = _adapter(stopped)
    capsys.readouterr()
    assert main(["train", "-c", CONFIG, *common, extracted, f"output_dir={stopped}", "training.max_steps=4"]) == 0
    captured = capsys.readouterr()
    assert "steps 4 (resumed from 2)" in captured.out and "reusing the examples" in captured.err
    history = [json.loads(x) for x in (stopped / "training" / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == [1, 2, 3, 4]
    a, b = _adapter(straight), _adapter(stopped)
    assert not torch.allclose(first["prompt_embeddings"], b["prompt_embeddings"])
    assert torch.allclose(a["prompt_embeddings"], b["prompt_embeddings"], atol=1e-6)
    # resume=false starts the run afresh.
    assert main(["train", "-c", CONFIG, *common, extracted, f"output_dir={stopped}", "training.max_steps=2",
                 "training.resume=false"]) == 0  # fmt: skip
    assert "steps 2 (resumed from 0)" in capsys.readouterr().out
    assert torch.allclose(_adapter(stopped)["prompt_embeddings"], first["prompt_embeddings"], atol=1e-6)


def test_prefix_generation_without_an_adapter_is_a_clear_error(ray_cluster, tmp_path, capsys):
    from ctrlgen.cli import main

    assert main(["generate", "-c", CONFIG, f"output_dir={tmp_path}"]) == 2
    assert "needs a PEFT adapter" in capsys.readouterr().err


def test_a_killed_run_resumes_from_its_last_checkpoint(trained, tmp_path, shared, capsys):
    """The job's process (and the local Ray cluster it started) is SIGKILLed mid-run; a re-run continues."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from ctrlgen.cli import main

    out = tmp_path / "run"
    args = [f"output_dir={out}", f"corpus.path={shared / 'physionet-deid'}", _input(trained), "training.epochs=4",
            "training.checkpoint_every=4"]  # fmt: skip
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen([sys.executable, "-m", "ray_jobs.train", "-c", CONFIG, *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    snapshot = out / "ray_train" / "prefix" / "checkpoint_manager_snapshot.json"
    try:
        deadline = time.monotonic() + 300
        while not snapshot.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert snapshot.is_file(), "no checkpoint within 300 s"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not (out / "adapter").exists()  # it never finished
    assert main(["train", "-c", CONFIG, *args]) == 0
    captured = capsys.readouterr()
    resumed = int(captured.out.split("resumed from ")[1].split(")")[0])
    assert resumed in (4, 8, 12) and "steps 16 (" in captured.out
    history = [json.loads(x) for x in (out / "training" / "metrics.jsonl").read_text().splitlines()]
    assert [h["step"] for h in history] == list(range(1, 17))


def test_more_tokeniser_actors_make_the_same_examples_in_the_same_order(trained, tmp_path, shared, monkeypatch):
    import ray_jobs.train
    from ctrlgen import storage
    from ctrlgen.config import load_config
    from ray_jobs.train import _rows, _tokenize

    cfg = load_config(CONFIG, [f"corpus.path={shared / 'physionet-deid'}", f"output_dir={tmp_path}",
                               "training.num_documents=null"])  # fmt: skip
    src = str(trained[0] / "extracted" / "status=ok")  # every extracted note
    monkeypatch.setattr(ray_jobs.train, "_TOKENIZE_BLOCK", 8)  # several blocks, so every actor gets some
    orders = []
    for actors in (1, 3):
        c = cfg.model_copy(update={"training": cfg.training.model_copy(update={"tokenize_actors": actors})})
        out = str(tmp_path / f"examples-{actors}")
        n_docs, layout, bad = _tokenize(c, src, out)
        assert n_docs == _rows(layout) + bad > 32  # every note with a control code
        files = storage.list_files(storage.join(out, "status=ok"), ".parquet")
        orders.append([(r["doc_id"], r["input_ids"]) for r in storage.dataset(files).to_table().to_pylist()])
    assert orders[0] == orders[1]


def _history(out):
    return [json.loads(x) for x in (out / "training" / "metrics.jsonl").read_text().splitlines()]


def test_dp_sgd_adds_one_noise_draw_per_logical_batch_on_one_or_two_workers(trained, tmp_path, shared, capsys):
    """training.variant=dp: the same logical batch on 1 and 2 workers has the same sigma and sample rate, and
    the noise measured in every update is sigma * C (one draw for the logical batch, not one per worker:
    that would be sigma * C * sqrt(2)). The epsilon recorded beside the adapter is the accountant's."""
    from ctrlgen.cli import main
    from ctrlgen.training.dp import epsilon_spent

    common = [f"corpus.path={shared / 'physionet-deid'}", _input(trained), "training.variant=dp", "training.dp.logical_batch=8",
              "training.dp.max_grad_norm=0.0001", "training.max_steps=3", "training.epochs=1",
              "training.dp.unit=note"]  # fmt: skip  # the 32 notes come from a few patients
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["train", "-c", CONFIG, *common, f"output_dir={two}"]) == 0
    assert "DP-SGD: epsilon" in capsys.readouterr().out
    assert main(["train", "-c", CONFIG, *common, f"output_dir={one}", "training.num_workers=1",
                 "training.cpus_per_worker=1"]) == 0  # fmt: skip
    p1, p2 = (json.loads((o / "adapter" / "privacy.json").read_text()) for o in (one, two))
    for key in ("sample_rate", "noise_multiplier", "steps", "logical_batch", "examples", "units"):
        assert p1[key] == p2[key]
    assert p2["unit"] == "note" and p2["units"] == p2["examples"] == 32 and "not_private" not in p2
    assert p2["per_worker_batch"] == [4.0, 4.0] and p1["per_worker_batch"] == [8.0] and p2["sample_rate"] == 0.25
    assert p2["epsilon"] == epsilon_spent(p2["noise_multiplier"], 0.25, 3, 1e-5) and 0 < p2["epsilon"] < 8.0
    assert json.loads((two / "training" / "privacy.json").read_text()) == p2
    sigma_c = p2["noise_multiplier"] * 0.0001
    for out in (one, two):
        history = _history(out)
        assert [h["step"] for h in history] == [1, 2, 3]
        for h in history:  # 1,280 prefix coordinates per draw: the estimate is within a few percent
            assert h["noise_std"] == pytest.approx(sigma_c, rel=0.12), (out.name, h)
            assert h["clipped_share"] == 1.0  # C = 1e-4 is below every example's gradient norm
    # The two workers drew one Poisson sample of the same examples (each its own share, from OS entropy):
    # the batch sizes are binomial around 8.
    assert all(0 < h["examples"] <= 20 for h in _history(two) + _history(one))
    # LoRA instead of the prefix (training.adapter=lora): its matrices get the same clipping and one noise
    # draw per logical batch; the adapter is a standard PEFT LoRA adapter the prefix mode can load.
    lora = tmp_path / "lora"
    assert main(["train", "-c", CONFIG, *common, f"output_dir={lora}", "training.adapter=lora"]) == 0
    assert json.loads((lora / "adapter" / "adapter_config.json").read_text())["peft_type"] == "LORA"
    assert json.loads((lora / "adapter" / "privacy.json").read_text())["noise_multiplier"] == p2["noise_multiplier"]
    for h in _history(lora):
        assert h["noise_std"] == pytest.approx(sigma_c, rel=0.12) and h["clipped_share"] == 1.0
    from ctrlgen.config import SamplingConfig, load_config
    from ctrlgen.generation import GenerationRequest, HFEngine
    from ctrlgen.models import load_causal_lm
    from ctrlgen.training.prefix import load_prefix_model

    base, tok = load_causal_lm(load_config(CONFIG).model)
    out = HFEngine(load_prefix_model(base, str(lora / "adapter")), tok, SamplingConfig(max_new_tokens=4)).generate(
        [GenerationRequest("Control code:\nPERSON: Ann Lee\nDocument:\n", seed=1)] * 2
    )
    # The adapter's weights come from OS-entropy noise, so what it samples differs run to run: a row may end
    # early on the tiny tokenizer's </s> or <pad>, but it ends for a stated reason, and one seed gives one row.
    for r in out:
        assert r.error is None and 0 <= r.new_tokens <= 4, r
        assert (r.new_tokens == 4) == (r.finish == "length") and r.finish in ("length", "eos", "stop"), r
    assert out[0].token_ids == out[1].token_ids and out[0].text == out[1].text


def test_dp_sgd_per_patient_draws_secret_noise_and_stamps_reproducible_runs(trained, tmp_path, shared, capsys):
    """The default privacy unit on PhysioNet (every note names its patient) is the patient: q over patients,
    one clipped gradient per drawn patient, epsilon = Opacus's accountant at that rate. Two runs of one config
    draw different noise (OS entropy); a training.dp.reproducible_noise run is stamped not private in
    privacy.json, summary.json and the printed summary."""
    import pyarrow.parquet as pq
    from opacus.accountants import create_accountant

    from ctrlgen.cli import main

    common = [f"corpus.path={shared / 'physionet-deid'}", _input(trained), "training.variant=dp", "training.dp.logical_batch=2",
              "training.dp.noise_multiplier=1.0", "training.dp.max_grad_norm=0.0001", "training.max_steps=2",
              "training.epochs=1", "training.checkpoint_every=1000"]  # fmt: skip
    runs = {name: tmp_path / name for name in ("a", "b", "seeded")}
    assert main(["train", "-c", CONFIG, *common, f"output_dir={runs['a']}"]) == 0
    capsys.readouterr()
    assert main(["train", "-c", CONFIG, *common, f"output_dir={runs['b']}"]) == 0
    assert main(["train", "-c", CONFIG, *common, f"output_dir={runs['seeded']}",
                 "training.dp.reproducible_noise=true"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    patients = {r["patient"] for r in pq.read_table(runs["a"] / "train_data" / "status=ok").to_pylist()}
    assert None not in patients and 2 <= len(patients) < 32
    priv = {n: json.loads((o / "adapter" / "privacy.json").read_text()) for n, o in runs.items()}
    a = priv["a"]
    assert a["unit"] == "patient" and a["units"] == len(patients) and a["examples"] == 32
    assert a["sample_rate"] == 2 / len(patients) and a["randomness"] == "os.urandom" and "not_private" not in a
    acc = create_accountant("rdp")
    for _ in range(2):
        acc.step(noise_multiplier=1.0, sample_rate=2 / len(patients))
    assert a["epsilon"] == pytest.approx(acc.get_epsilon(delta=1e-5), rel=1e-9)
    for h in _history(runs["a"]):  # whole patients drawn: at least as many notes as patients, each sum clipped
        assert h["units"] <= h["examples"] and (h["units"] == 0 or h["clipped_share"] == 1.0)
    # Secret noise: the same config twice gives other prefixes.
    ta, tb = _adapter(runs["a"]), _adapter(runs["b"])
    assert ta.keys() == tb.keys() and any(not torch.equal(ta[k], tb[k]) for k in ta)
    # Reproducible noise (replayed exactly: tests/unit/test_dp.py): stamped not private wherever the run reports.
    seeded = priv["seeded"]
    assert "reproducible_noise" in seeded["not_private"] and seeded["reproducible_noise"] is True
    summary = json.loads((runs["seeded"] / "training" / "summary.json").read_text())
    assert summary["privacy"]["not_private"] == seeded["not_private"]
    assert printed.count("NOT PRIVATE") == 1
    assert all("not_private" not in priv[n] and priv[n]["reproducible_noise"] is False for n in ("a", "b"))


def test_dp_sgd_at_epsilon_8_exposes_a_canary_less_than_without_noise(trained, tmp_path, shared):
    """SmolLM2 (the tiny random model cannot memorise a secret), 16 notes that all start with one canary:
    the same optimiser without noise (sigma 0, epsilon infinite) memorises it; at epsilon 8 it does not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ctrlgen.cli import main
    from ctrlgen.config import load_config
    from ctrlgen.metrics.canary import canary_prompt, candidate_texts, exposure, insert_canaries, make_canaries
    from ctrlgen.metrics.utility import sequence_nll
    from ctrlgen.models import load_causal_lm
    from ctrlgen.training.prefix import load_prefix_model

    base = [f"corpus.path={shared / 'physionet-deid'}", "model.name=smollm2-135m"]
    extracted = trained[0] / "extracted"  # the tiny config's extraction (it does not depend on the model)
    table = pa.concat_tables([pq.read_table(f) for f in sorted((extracted / "status=ok").glob("*.parquet"))])
    canary = make_canaries(1, seed=0, repeats=(16,))[0]
    # Out of the control code (Carlini et al.'s setting): with the secret in the prompt a model lowers its loss
    # by copying it, and exposure measured behind the code without it shows no memorisation.
    planted = insert_canaries(table.to_pylist()[:16], [canary], seed=0, in_code=False)
    prompt = canary_prompt(planted, canary)
    (tmp_path / "canaried" / "status=ok").mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(planted, schema=table.schema), tmp_path / "canaried" / "status=ok" / "a.parquet"
    )
    train = [*base, f"training.input={tmp_path / 'canaried'}", "training.variant=dp", "training.num_documents=null",
             "training.dp.logical_batch=8", "training.epochs=10", "training.learning_rate=0.05",
             "training.max_doc_tokens=16", "training.num_workers=1", "training.cpus_per_worker=1",
             "training.torch_threads=2", "training.checkpoint_every=1000", "training.log_every=10",
             "training.dp.unit=note", "training.require_code=false"]  # fmt: skip  # notes of few patients; hosts whose
    # only entity was the canary have an empty code
    cfg = load_config(CONFIG, base)
    scores = {}
    for name, extra in (("inf", ["training.dp.noise_multiplier=0"]), ("eps8", ["training.dp.target_epsilon=8"])):
        out = tmp_path / name
        assert main(["train", "-c", CONFIG, *train, *extra, f"output_dir={out}"]) == 0
        lm, tok = load_causal_lm(cfg.model)
        tuned = load_prefix_model(lm, str(out / "adapter"))

        def nll(texts, m=tuned, t=tok):
            return [n for n, _ in sequence_nll(m, t, texts, max_tokens=256, prompts=[prompt] * len(texts))]

        texts = candidate_texts(canary, 199, seed=0)  # the canary first, then other secrets of its shape
        nlls = nll(texts)

        def scored(asked, t=texts, n=nlls):  # exposure asks for the same candidates: scored once
            assert asked == t
            return n

        scores[name] = exposure(canary, scored, n_candidates=199)[0]
        # How far below the other secrets the canary's NLL sits (nats): continuous, unlike a rank capped at 200.
        scores[name + "_gap"] = statistics.median(nlls[1:]) - nlls[0]
        scores[name + "_loss"] = _history(out)[-1]["loss"]
    print(f"canary scores: {scores}")
    assert json.loads((tmp_path / "inf" / "adapter" / "privacy.json").read_text())["epsilon"] == float("inf")
    assert scores["inf_loss"] < 0.5 < scores["eps8_loss"]  # memorised vs not
    # Noise-free, the secret is memorised (ranked first); at epsilon 8 its NLL stays far closer to the others'
    # (the rank alone is a weak test: it is capped at 200 candidates, and the secret noise differs every run).
    assert scores["inf"] == max(scores["inf"], scores["eps8"]) and scores["inf_gap"] > scores["eps8_gap"] + 20, scores
