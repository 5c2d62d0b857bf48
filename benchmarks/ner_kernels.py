"""The clinical NER's weights across CPUs (issue 41: the same extractor on every install).

`make setup` trains the configured NER (``ctrlgen train-ner -c configs/extract_physionet_ner.yaml``), seeded and
deterministic on one machine. Across machines its arithmetic may run on other kernels: numpy's OpenBLAS picks
them per CPU (pinned to Haswell on x86-64 with AVX2 since the pin was added), numpy's own loops dispatch on AVX-512,
and thinc's matrix library, BLIS, picks its own sub-configuration per CPU with no setting to pin it (``skx`` on
AVX-512 Intel CPUs; its generic C code on CPUs its build does not know, such as AMD Zen 3). Training now runs on
thinc's numpy ops without BLIS (``ctrlgen.extract.ner.NUMERICS``), numpy's AVX-512 loops off
(``pinned_blas_env``), OpenBLAS on one thread (its products split over threads give other weights). This script, on the machine it runs on:

1. says which kernels the CPU gets: its vendor, family and model, AVX-512 or not, BLIS's own sub-configuration;
2. trains a reduced NER (the first ``--notes`` notes, ``--epochs`` epochs, the config's architecture) in fresh
   processes started with the pinned environment, twice on BLIS (the training before this change) and twice on
   the numpy ops, interleaved: each path's SHA-256 (deterministic on one machine?) and time;
3. trains the configured NER as `make setup` does (``ctrlgen train-ner``, into a temporary directory): its SHA-256;
4. with ``--cv``, what a CPU's model costs in quality: the configured engine (the NER and the rules, frozen) by
   patient-level CV, its 5 fold NERs trained on this CPU in the pinned environment into a temporary directory (never
   another CPU's cached models), pooled recall and precision beside each CPU's hash (~10 min more on 2 cores).

docs/benchmarks/ner_kernels.json keeps one entry per CPU and numerics (a run on another CPU adds its own, a run with
new numerics keeps the earlier one as history): **two CPUs whose configured-NER hashes of one training are equal
train the same model.** With ``--emulate`` the reduced training also runs under qemu-user's CPU models (the numerics
now, and spaCy's output layer left on BLIS as before the fix). The section also lists the hashes that `make setup`
printed in the kept CI logs (docs/benchmarks/suite/) and which CPU and numerics recorded each.

    .venv/bin/python benchmarks/ner_kernels.py            # ~10 min on this project's 2-core machines
    .venv/bin/python benchmarks/ner_kernels.py --cv       # also the configured engine's CV on this CPU's fold NERs
    .venv/bin/python benchmarks/ner_kernels.py --cv --emulate Haswell-v4,EPYC-Milan  # + emulated CPUs (~20 min)
    .venv/bin/python benchmarks/ner_kernels.py --setup-log LOG  # also keep a pre-change `make setup` log's hash
    .venv/bin/python benchmarks/ner_kernels.py --render
    # the reduced training under another C library, e.g. Ubuntu 24.04's (the lent GPU hosts' glibc 2.39):
    curl -O http://archive.ubuntu.com/ubuntu/pool/main/g/glibc/libc6_2.39-0ubuntu8.12_amd64.deb
    dpkg-deb -x libc6_2.39-0ubuntu8.12_amd64.deb /tmp/libc6_2.39-0ubuntu8.12_amd64
    .venv/bin/python benchmarks/ner_kernels.py --loader /tmp/libc6_2.39-0ubuntu8.12_amd64/usr/lib/x86_64-linux-gnu

On a lent machine (its CPU, without this repository's virtual environment): ``bash benchmarks/kernels_run.sh`` there
runs this script with ``--entry`` (the CPU's entry to a file, docs untouched), and ``--merge FILE`` here adds it;
``bash benchmarks/kernels_run.sh --cv-only --workers 5`` there is the CV alone (a second call: ~5 min on 16 cores),
whose file ``--merge`` adds to that CPU's entry.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import publish  # noqa: E402

JSON = ROOT / "docs" / "benchmarks" / "ner_kernels.json"
TITLE = "Entity extraction: the clinical NER's weights across CPUs"
CONFIG = "configs/extract_physionet_ner.yaml"
SUITE_LOGS = ROOT / "docs" / "benchmarks" / "suite"
#: the interpreter of the trainings' fresh processes: this repository's environment, or under
#: benchmarks/kernels_run.sh (a lent machine, the carried site on PYTHONPATH) the one running this script
_VENV = ROOT / ".venv" / "bin" / "python"
PY = str(_VENV) if _VENV.exists() and not os.environ.get("KERNELS_RUN") else sys.executable
#: config overrides for data outside ../shared (``--physionet``, ``--deid-lists``): the same notes and lists
OVERRIDES: list[str] = []

# One reduced training in a fresh process, as the cross-validation trains its fold models (crossval._train): "numpy"
# the training now (train_ner: thinc's numpy ops without BLIS, every layer), "blis" thinc's default ops (BLIS's
# products: train_ner without its use_ops context), "output-on-blis" the numpy ops but for spaCy's output layer, left
# on the BLIS ops spaCy builds it with (the training before ctrlgen moved that layer: train_ner without _same_ops).
_CHILD = """
import contextlib, json, sys, time
from pathlib import Path
sys.path.insert(0, {root!r})
import thinc.api
from ctrlgen.config import PhysionetCorpusConfig, load_config
from ctrlgen.corpora import load_corpus
from ctrlgen.extract.crossval import TrainJob, _train
cfg = load_config({config!r}, ["extraction.ner_training.epochs={epochs}", *{overrides!r}])
docs = load_corpus(PhysionetCorpusConfig(path=cfg.corpus.path, identifiers="direct+quasi", limit={notes}))[0]
if {mode!r} == "blis":
    thinc.api.use_ops = lambda *a, **k: contextlib.nullcontext()
if {mode!r} == "output-on-blis":
    import ctrlgen.extract.ner
    ctrlgen.extract.ner._same_ops = lambda *a, **k: None
t0 = time.perf_counter()
job = TrainJob(docs, Path({out!r}), cfg.extraction.ner_training, cfg.nlp.spacy_model, cfg.extraction.name_lists, {{}})
res = _train(job)
print(json.dumps({{"sha256": res.weights_sha256, "seconds": round(time.perf_counter() - t0, 1)}}))
"""
#: the configured NER's hash as `ctrlgen train-ner` prints it (make-setup and CI logs)
WEIGHTS = re.compile(r"weights sha256 ([0-9a-f]{64})")


def cpu() -> dict[str, Any]:
    """The CPU's identity (vendor, family, model) and the kernels its libraries pick."""
    from ctrlgen.extract.ner import cpu_identity, cpuinfo

    info, flags = cpuinfo()
    probe = "import numpy as np, blis.py; a = np.ones((8, 8), dtype='float32'); blis.py.gemm(a, a)"
    out = subprocess.run([PY, "-c", probe], env={**os.environ, "BLIS_ARCH_DEBUG": "1"}, capture_output=True,
                         text=True, check=True)  # fmt: skip
    blis = re.search(r"sub-configuration '(\w+)'", out.stdout + out.stderr)
    return {
        "key": cpu_identity(),
        "name": info.get("model name", "?"),
        "avx512": "avx512f" in flags,
        "avx2": {"avx2", "fma"} <= flags,
        "blis": blis.group(1) if blis else "?",
        "cores": os.cpu_count(),
        "software": f"{' '.join(platform.libc_ver())}, Python {platform.python_version()}",
    }


def _child(mode: str, notes: int, epochs: int, out: str, env: dict[str, str], emulate: str = "",
           python: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """One reduced training in a fresh process; ``emulate``: a qemu-user CPU model to run it under (its CPUID: vendor
    and features, every instruction emulated on this machine); ``python``: the command that starts the interpreter
    instead of :data:`PY` (another C library's loader: :func:`loader_python`)."""
    code = _CHILD.format(root=str(ROOT), config=str(ROOT / CONFIG), notes=notes, out=out, epochs=epochs, mode=mode,
                         overrides=OVERRIDES)
    cmd = (["qemu-x86_64", "-cpu", emulate] if emulate else []) + [*(python or [PY]), "-c", code]
    res = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT)
    if res.returncode:
        raise SystemExit(f"reduced training ({mode}) failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def loader_python(libdir: Path) -> tuple[list[str], dict[str, str], str]:
    """The command that runs :data:`PY`'s interpreter on the C library in ``libdir`` (a folder with its loader, libc
    and libm: e.g. an unpacked libc6 package's usr/lib/x86_64-linux-gnu) through that loader, the environment that
    gives it :data:`PY`'s packages, and that C library's version as the interpreter reports it."""
    ld = libdir / "ld-linux-x86-64.so.2"
    if not ld.is_file():
        raise SystemExit(f"--loader {libdir}: no ld-linux-x86-64.so.2 there")
    where = "import sys, sysconfig, site; print(sys._base_executable); print(sysconfig.get_config_var('LIBDIR')); " \
            "print(site.getsitepackages()[0])"  # fmt: skip
    real, pylib, site_dir = subprocess.run([PY, "-c", where], capture_output=True, text=True, check=True).stdout.split()
    cmd = [str(ld), "--library-path", f"{libdir}:{pylib}", str(Path(real).resolve())]
    env = {"PYTHONPATH": os.pathsep.join([site_dir, *filter(None, [os.environ.get("PYTHONPATH")])])}
    libc = subprocess.run([*cmd, "-c", "import platform; print(' '.join(platform.libc_ver()))"], env={**os.environ, **env},
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return cmd, env, libc


def under_loader(libdir: Path, notes: int, epochs: int) -> dict[str, Any]:
    """The reduced training (numpy path, pinned environment) on this machine under another C library."""
    from ctrlgen.extract.ner import pinned_blas_env

    cmd, env, libc = loader_python(libdir)
    with tempfile.TemporaryDirectory() as tmp:
        run = _child("numpy", notes, epochs, f"{tmp}/loader", {**pinned_blas_env(), **env}, python=cmd)
    print(f"[ner_kernels] under {libc} ({libdir}): {run}", file=sys.stderr, flush=True)
    return {"libc": libc, "libdir": str(libdir), **run}


def configured(env: dict[str, str], out: str) -> dict[str, Any]:
    """The NER `make setup` trains, trained the same way (``ctrlgen train-ner``), into ``out``."""
    t0 = time.perf_counter()
    res = subprocess.run([PY, "-m", "ctrlgen.cli", "train-ner", "-c", CONFIG, "--out", out, *OVERRIDES],
                         env={**os.environ, **env}, capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    if res.returncode:
        raise SystemExit(f"ctrlgen train-ner failed:\n{res.stderr[-3000:]}")
    meta = json.loads((Path(out) / "ctrlgen_ner.json").read_text())
    return {"sha256": meta["weights_sha256"], "seconds": round(time.perf_counter() - t0, 1),
            "key": meta["trained_on"]["key"], "blas": meta["blas"]}  # fmt: skip


def suite_hashes() -> dict[str, int]:
    """The configured NER's hashes that `make setup` printed in the kept CI logs, with how many set-ups printed each."""
    found: Counter[str] = Counter()
    for log in sorted(SUITE_LOGS.glob("*.log")):
        found.update(WEIGHTS.findall(log.read_text(errors="replace")))
    return dict(found)


def _commit() -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "ctrlgen", "pyproject.toml", "requirements.lock"],
                           capture_output=True, text=True, cwd=ROOT).stdout.strip()  # fmt: skip
    return commit.stdout.strip() + (" + uncommitted changes" if dirty else "")


def measure(notes: int, epochs: int, repeats: int, emulate: Sequence[str] = (), commit: str = "") -> dict[str, Any]:
    from ctrlgen.extract.ner import NUMERICS, pinned_blas_env

    env = pinned_blas_env()
    runs: dict[str, list[dict[str, Any]]] = {"blis": [], "numpy": []}
    emulated: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            for mode in runs:
                runs[mode].append(_child(mode, notes, epochs, f"{tmp}/{mode}{r}", env))
                print(f"[ner_kernels] {mode} #{r + 1}: {runs[mode][-1]}", file=sys.stderr, flush=True)
        for model in emulate:  # under other CPUs' CPUID, on this machine: the training now and before the fix
            for mode in ("numpy", "output-on-blis"):
                emulated.append({"cpu": model, "mode": mode,
                                 **_child(mode, notes, epochs, f"{tmp}/emulated", env, model)})  # fmt: skip
                shutil.rmtree(f"{tmp}/emulated", ignore_errors=True)
                print(f"[ner_kernels] emulated {model}, {mode}: {emulated[-1]}", file=sys.stderr, flush=True)
        conf = configured(env, f"{tmp}/configured")
    print(f"[ner_kernels] configured: {conf['sha256']} ({conf['seconds']} s)", file=sys.stderr, flush=True)
    return {
        "date": datetime.now(UTC).date().isoformat(),
        "commit": commit or _commit(),
        "cpu": cpu(),
        "env": env,
        "numerics": NUMERICS,
        "reduced": {"notes": notes, "epochs": epochs, "runs": runs, "emulated": emulated},
        "configured": conf,
    }


def cross_validated(workers: int | None = None) -> dict[str, Any]:
    """The configured engine by patient-level CV with fold NERs trained on this CPU (the rules frozen: the engine as
    configured, no in-fold selection), pooled over the folds' held-out notes."""
    from ner_threshold import PHYSIONET, _scores, _sum

    from ctrlgen.config import PhysionetCorpusConfig, load_config
    from ctrlgen.corpora import load_corpus
    from ctrlgen.extract.crossval import _fold_jobs, train_cached
    from ctrlgen.extract.presidio import PresidioExtractor

    cfg = load_config(str(ROOT / CONFIG), OVERRIDES)
    ex = cfg.extraction.model_copy(update={"setting": "unknown"})
    ex = ex.model_copy(update={"rule_tuning": ex.rule_tuning.model_copy(update={"enabled": False})})
    path = cfg.corpus.path if OVERRIDES else str(PHYSIONET)
    docs = load_corpus(PhysionetCorpusConfig(path=path, identifiers="direct+quasi"))[0]
    k = ex.ner_training.folds
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:  # this CPU's fold models only (the cache keys name no CPU)
        outer = _fold_jobs(docs, k, ex, Path(tmp), cfg.nlp.spacy_model, "physionet-deid")
        # each fold in its own process on one pinned thread: the worker count changes no weights
        models = train_cached([job for job, _, _ in outer], workers or ex.ner_training.workers)
        trained = time.perf_counter() - t0
        folds = []
        for (_, _, gold), model in zip(outer, models, strict=True):
            ext = PresidioExtractor(ex.model_copy(update={"ner_model": model}), cfg.nlp.spacy_model, "direct+quasi")
            meta = json.loads((Path(model) / "ctrlgen_ner.json").read_text())
            folds.append({"sha256": meta["weights_sha256"], "by": _scores(gold, ext(gold))})
            print(f"[ner_kernels] CV fold {len(folds)}/{k} scored", file=sys.stderr, flush=True)
    pooled = _sum([f["by"] for f in folds])["ALL"]
    return {"folds": folds, "recall": pooled.recall, "precision": pooled.precision, "found": pooled.detected,
            "gold": pooled.gold, "predicted": pooled.predicted, "train_minutes": round(trained / 60, 1)}  # fmt: skip


#: the numerics of entries recorded before they were stored (spaCy's output layer still on BLIS: see NUMERICS)
OLD_NUMERICS = "thinc numpy ops, no BLIS"


def _numerics_legend(machines: dict[str, Any]) -> dict[str, str]:
    """Short names (N1, N2, ...) for the numerics the entries were trained with, in order of appearance."""
    seen = dict.fromkeys(m.get("numerics", OLD_NUMERICS) for m in machines.values())
    return {f"N{i + 1}": v for i, v in enumerate(seen)}


def _same_weights(machines: dict[str, Any], legend: dict[str, str]) -> list[str]:
    """For each training key, its distinct configured-NER hashes and the CPUs that trained each (one hash: one
    model on all of them)."""
    by_key: dict[str, dict[str, list[str]]] = {}
    for m in machines.values():
        key = f"`{m['configured'].get('key', '?')}` ({legend[m.get('numerics', OLD_NUMERICS)]})"
        by_key.setdefault(key, {}).setdefault(m["configured"]["sha256"][:8], []).append(m["cpu"]["key"])
    out = []
    for key, hashes in by_key.items():
        n = sum(len(c) for c in hashes.values())
        head = f"{key}: " + (f"one model on {n} CPUs" if len(hashes) == 1 else f"{len(hashes)} models over {n} CPUs")
        out.append(head + " (" + "; ".join(f"`{h}` on {', '.join(c)}" for h, c in hashes.items()) + ")")
    return out


def report(r: dict[str, Any]) -> str:
    from ctrlgen.extract.ner_setup import cv_range, cv_row

    machines = r["machines"]
    lines = [
        f"Command: `{r['command']}` (`--render` rewrites this section from docs/benchmarks/ner_kernels.json, which "
        "keeps one entry per CPU: a run on another CPU adds its row). Training of the configured NER "
        f"(`ctrlgen train-ner -c {CONFIG}`, what `make setup` runs) on thinc's numpy ops without BLIS, numpy's "
        "OpenBLAS pinned to Haswell on one thread and numpy's AVX-512 loops off. **Equal hashes of one training "
        "(the same cache key: data, settings and numerics) on two CPUs: the same model.** Numerics: "
        f"{'; '.join(f'{k} = {v}' for k, v in _numerics_legend(machines).items())}.",
        "",
        "| CPU | AVX-512 | BLIS's own choice | software | numerics | training key | configured NER sha256 | "
        "trained in s | commit | date |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    legend = {v: k for k, v in _numerics_legend(machines).items()}
    for m in machines.values():
        c = m["cpu"]
        lines.append(f"| {c['key']} ({c['name']}, {c['cores']} cores) | {'yes' if c['avx512'] else 'no'} | "
                     f"{c['blis']} | {c.get('software', '?')} | {legend[m.get('numerics', OLD_NUMERICS)]} | "
                     f"`{m['configured'].get('key', '?')}` | `{m['configured']['sha256'][:16]}` | "
                     f"{m['configured']['seconds']:.0f} | {m['commit']} | {m['date']} |")  # fmt: skip
    lines += ["", "Per training (one cache key), the configured NER's weights over the CPUs that trained it: "
              + "; ".join(_same_weights(machines, legend)) + "."]
    emulated = [(m, e) for m in machines.values() for e in m["reduced"].get("emulated", [])]
    if emulated:
        lines += [
            "",
            "The same reduced training (numpy path) under qemu-user's CPU models on one machine (`--emulate`): the "
            "process sees that model's CPUID (vendor and features) and every instruction is emulated, so a hash that "
            "follows the emulated CPU comes from code that chooses by CPUID, not from the hardware's arithmetic.",
            "",
            "| machine | emulated CPU | training | sha256 | s |",
            "|---|---|---|---|---|",
        ]
        for m, e in emulated:
            how = (f"numerics {legend[m.get('numerics', OLD_NUMERICS)]}" if e.get("mode", "numpy") == "numpy"
                   else "the same, spaCy's output layer left on BLIS (before the fix)")  # fmt: skip
            lines.append(f"| {m['cpu']['key']} | {e['cpu']} | {how} | `{e['sha256'][:12]}` | {e['seconds']:.0f} |")
        native = [(m, x) for m, e in emulated[:1] for x in m["reduced"]["runs"]["numpy"][:1]]
        lines += [f"| {m['cpu']['key']} | none (native) | numerics {legend[m.get('numerics', OLD_NUMERICS)]} | "
                  f"`{x['sha256'][:12]}` | {x['seconds']:.0f} |" for m, x in native]  # fmt: skip
    loaders = [(m, x) for m in machines.values() for x in m["reduced"].get("loaders", [])]
    if loaders:
        lines += [
            "",
            "The same reduced training (numpy path) on one machine under another C library (`--loader`: the "
            "interpreter started through that library's loader, so libc and libm are that version's): a hash equal "
            "to the machine's own shows the C library does not change the weights.",
            "",
            "| machine | its own C library | run under | sha256 | its own sha256 | s |",
            "|---|---|---|---|---|---|",
        ]
        lines += [f"| {m['cpu']['key']} | {m['cpu'].get('software', '?').split(',')[0]} | {x['libc']} | "
                  f"`{x['sha256'][:12]}` | `{m['reduced']['runs']['numpy'][0]['sha256'][:12]}` | {x['seconds']:.0f} |"
                  for m, x in loaders]  # fmt: skip
    with_cv = [m for m in machines.values() if m.get("cv")]
    if with_cv:
        lines += [
            "",
            "What a CPU's model costs in quality (`--cv`): the configured engine (its NER and the rules, frozen: no "
            "in-fold selection) by patient-level CV, the 5 fold NERs trained on that CPU in the pinned environment; "
            "pooled over all 1,818 notes. The spread between rows is the spread between set-ups on those CPUs.",
            "",
            "| CPU | numerics | fold NERs sha256 (folds 1-5) | recall % | precision % | found / gold | predicted |",
            "|---|---|---|---|---|---|---|",
        ]
        lines += [cv_row(m["cpu"]["key"], m["cv"], legend[m.get("numerics", OLD_NUMERICS)]) for m in with_cv]
        ranges = []
        for name, numerics in _numerics_legend(machines).items():  # a range over CPUs of one training only
            same = [m["cv"] for m in with_cv if m.get("numerics", OLD_NUMERICS) == numerics]
            if len(same) > 1:
                ranges.append(f"{name}: {cv_range(same)} over {len(same)} CPUs")
            elif same:
                ranges.append(f"{name}: one CPU so far")
        lines += ["", "Range over CPUs, per numerics: " + "; ".join(ranges) + "."]
    runs = [f"{m['cpu']['key']}: `{m['command']}`" + (f" ({m['note']})" if m.get("note") else "")
            for m in machines.values() if m.get("command")]
    if runs:
        lines += ["", "Each CPU's run: " + "; ".join(runs) + "."]
    lines += [
        "",
        "Reduced trainings (the first notes of the corpus, the config's architecture, fresh processes with the "
        "pinned environment, interleaved): with thinc's default ops (BLIS's products) and with the entry's numerics.",
        "",
        "| CPU | path | notes x epochs | sha256 of each run | s per run |",
        "|---|---|---|---|---|",
    ]
    for m in machines.values():
        red = m["reduced"]
        numerics = legend[m.get("numerics", OLD_NUMERICS)]
        for mode, label in (("blis", "thinc's default ops: BLIS"), ("numpy", f"numerics {numerics}")):
            runs = red["runs"][mode]
            hashes = ", ".join(f"`{x['sha256'][:12]}`" for x in runs)
            secs = " / ".join(f"{x['seconds']:.1f}" for x in runs)
            lines.append(f"| {m['cpu']['key']} | {label} | {red['notes']} x {red['epochs']} | {hashes} | {secs} |")
    before = {m["cpu"]["key"]: m["setup_before"] for m in machines.values() if m.get("setup_before")}
    suite = suite_hashes()  # the kept logs, read at each render (a CI log kept later is counted without a rerun)
    recorded: dict[str, list[str]] = {}
    for m in machines.values():
        recorded.setdefault(m["configured"]["sha256"], []).append(
            f"{legend[m.get('numerics', OLD_NUMERICS)]} on {m['cpu']['key']}")

    def said(h: str, n: int) -> str:
        where = "; ".join(dict.fromkeys(recorded.get(h, []))) or "recorded by no run here: another CPU, or a training before these numerics"
        return f"`{h[:16]}` ({n} set-up{'s' if n > 1 else ''}: {where})"

    if suite or before:
        lines += [
            "",
            "The configured NER's hashes that `make setup` printed in the kept CI logs (docs/benchmarks/suite/), with "
            "the CPUs and numerics that recorded each: " + "; ".join(said(h, n) for h, n in suite.items())
            + "".join(f"; on {k}, a set-up before the pinned numerics (`--setup-log`): `{h[:16]}`"
                      for k, h in before.items()) + ".",
        ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--notes", type=int, default=300, help="notes of the reduced trainings")
    ap.add_argument("--epochs", type=int, default=2, help="epochs of the reduced trainings")
    ap.add_argument("--repeats", type=int, default=2, help="reduced trainings per path")
    ap.add_argument(
        "--setup-log",
        type=Path,
        help="a `make setup` log of this machine from before this change: "
        "the configured NER's hash it printed is kept with this CPU's entry",
    )
    ap.add_argument("--emulate", default="", help="qemu-user CPU models (comma-separated, e.g. Haswell-v4,EPYC-Milan) "
                    "to run the reduced numpy-path training under as well (apt's qemu-user)")
    ap.add_argument("--cv", action="store_true", help="also the configured engine's patient-level CV on this CPU")
    ap.add_argument("--workers", type=int, default=None, help="with --cv: fold NERs trained side by side "
                    "(default the config's; each on one pinned thread, so the count changes no weights)")
    ap.add_argument("--loader", type=Path, help="only the reduced training (numpy path) under the C library in this "
                    "folder (its ld-linux-x86-64.so.2, libc and libm, e.g. an unpacked libc6 package's "
                    "usr/lib/x86_64-linux-gnu), added to this CPU's entry")
    ap.add_argument("--render", action="store_true", help="rewrite the section from the saved JSON")
    ap.add_argument("--physionet", type=Path, help="the PhysioNet notes, when not at the config's ../shared path")
    ap.add_argument("--deid-lists", type=Path, help="a folder with the deid tool's lists/ and dict/ (the config's "
                    "name_lists and common_words), when not at the config's ../shared path")
    ap.add_argument("--commit", default="", help="the commit measured, where this is no git checkout")
    ap.add_argument("--entry", type=Path, help="write this CPU's entry to this file, docs untouched (a lent machine)")
    ap.add_argument("--merge", type=Path, help="add an entry written with --entry on another machine, and render")
    ap.add_argument("--cv-only", action="store_true", help="only the CV (--cv), for a CPU whose entry is recorded "
                    "already (a second call on a lent machine); with --entry its file, which --merge adds to that "
                    "CPU's entry")
    args = ap.parse_args()
    if args.render:
        publish(TITLE, JSON, report)
        return
    r = json.loads(JSON.read_text()) if JSON.is_file() else {"machines": {}}
    if args.merge:
        m = json.loads(args.merge.read_text())
        if "configured" not in m:  # a --cv-only run's file: the CV of a CPU recorded already
            _add_cv(r, m)
        else:
            _add(r, m)
        return
    if args.loader:
        from ctrlgen.extract.ner import NUMERICS, cpu_identity

        entry = _entry(r, cpu_identity(), NUMERICS)
        if not entry or entry["reduced"]["notes"] != args.notes:
            raise SystemExit(f"no entry of this CPU ({cpu_identity()}) with the current numerics and {args.notes} "
                             "notes to compare with: run this script without --loader first")  # fmt: skip
        entry["reduced"].setdefault("loaders", []).append(under_loader(args.loader.resolve(), args.notes, args.epochs))
        publish(TITLE, JSON, report, r)
        return
    if args.physionet:
        OVERRIDES.append(f"corpus.path={args.physionet.resolve()}")
    if args.deid_lists:
        OVERRIDES.extend([f"extraction.name_lists={(args.deid_lists / 'lists').resolve()}",
                          f"extraction.common_words={(args.deid_lists / 'dict').resolve()}"])  # fmt: skip
    if args.cv_only:
        from ctrlgen.extract.ner import NUMERICS

        m = {"date": datetime.now(UTC).date().isoformat(), "commit": args.commit or _commit(), "cpu": cpu(),
             "numerics": NUMERICS, "cv": cross_validated(args.workers), "cv_command": _command()}  # fmt: skip
        if args.entry:
            args.entry.write_text(json.dumps(m, indent=1) + "\n")
            print(f"[ner_kernels] this CPU's CV: {args.entry}", file=sys.stderr, flush=True)
        else:
            _add_cv(r, m)
        return
    m = measure(args.notes, args.epochs, args.repeats, [x for x in args.emulate.split(",") if x], args.commit)
    m["command"] = _command()
    if args.entry:  # written now too: a run cut during the CV keeps the hashes
        args.entry.write_text(json.dumps(m, indent=1) + "\n")
    if args.cv:
        m["cv"] = cross_validated(args.workers)
    if args.setup_log:
        found = WEIGHTS.findall(args.setup_log.read_text(errors="replace"))
        m["setup_before"] = found[-1] if found else None
    if args.entry:
        args.entry.write_text(json.dumps(m, indent=1) + "\n")
        print(f"[ner_kernels] this CPU's entry: {args.entry}", file=sys.stderr, flush=True)
        return
    _add(r, m)


def _entry(r: dict[str, Any], key: str, numerics: str) -> dict[str, Any] | None:
    """The saved entry of CPU ``key`` if it was recorded under ``numerics`` (None otherwise)."""
    entry = r["machines"].get(key)
    return entry if entry and entry.get("numerics", OLD_NUMERICS) == numerics else None


def _command() -> str:
    """The command line of this run, as recorded in its entry (kernels_run.sh's on a lent machine)."""
    return os.environ.get("KERNELS_RUN") or shlex.join([".venv/bin/python", "benchmarks/ner_kernels.py", *sys.argv[1:]])


def _add_cv(r: dict[str, Any], m: dict[str, Any]) -> None:
    """Put a ``--cv-only`` run's CV into its CPU's entry (recorded with the same numerics); render."""
    entry = _entry(r, m["cpu"]["key"], m["numerics"])
    if not entry:
        raise SystemExit(f"no entry of {m['cpu']['key']} with numerics {m['numerics']!r}: merge its hashes first")
    entry["cv"] = m["cv"]
    entry["note"] = f"its CV in a separate run on {m['date']} (commit {m['commit']}): `{m['cv_command']}`"
    publish(TITLE, JSON, report, r)


def _add(r: dict[str, Any], m: dict[str, Any]) -> None:
    """Put one CPU's entry into the saved JSON (its earlier entry under other numerics kept as history); render."""
    key = m["cpu"]["key"]
    earlier = r["machines"].get(key)
    if earlier and earlier.get("numerics", OLD_NUMERICS) != m["numerics"]:  # another training: kept as history
        r["machines"][f"{key} ({earlier.get('numerics', OLD_NUMERICS)})"] = r["machines"].pop(key)
    r["machines"][key] = m
    r["command"] = ".venv/bin/python benchmarks/ner_kernels.py"
    r["date"] = m["date"]
    r.pop("suite_hashes", None)  # the JSON of an earlier run: the suite's hashes are read from the kept logs
    publish(TITLE, JSON, report, r)


if __name__ == "__main__":
    main()
