"""Ray Data job: many generation *cells* in one pass (the experiment matrix's generation stage).

A cell is what one run of the generation job (:mod:`ray_jobs.generate`) would make: one seed, its modes, a
seeded sample of ``num_documents`` targets from one extraction output, the ICL context pool from another, and
for the ``prefix`` mode one adapter with its fine-tuning values. The experiment has one cell per
(setting, seed, ICL modes) and per (setting, seed, prefix variant); run one job each, it started a Ray Data
pipeline, an actor pool and a model load per cell (12 for the CI matrix, about a minute each on a 2-core
machine, the largest share of its time). Here every cell's targets go through **one** actor pool:

1. per distinct (targets input, contexts input): the private values of both (fictional codes never use them),
   merged by a task (the driver holds a reference);
2. per cell: the context pool and the targets, the same seeded samples as the generation job's (the targets'
   rows, ``num_documents`` per cell, reach the driver: cells are small samples); per adapter: the fine-tuning
   value index, built by a task (:func:`ray_jobs.generate.finetune_index`);
3. one ``map_batches`` over every target, tagged with its cell: each actor loads the model once, registers every
   adapter on its one engine (the fast engine holds an adapter as its prefix keys/values) and runs
   :func:`ctrlgen.generation.icl.generate_rows` per cell of a batch with that cell's seed, modes, pool, fictional
   codes and adapter;
4. each cell's rows are written to ``<cell.output>/mode=<mode>/part-0.parquet`` (the generation job's layout,
   read by :func:`ctrlgen.generation.report.read_generated`), then ``_cell.json`` (the cell's fingerprint)
   last. With ``resume`` a cell whose marker matches is not generated again.

A row's text depends on its cell's seed, its ``doc_id`` and mode (contexts, fictional code and the engine's
sampling are seeded by them), the cell's pool and adapter, not on which rows share its batch (the engines
sample per row; see ``benchmarks/batch_reproducibility.py``): each cell's rows are those of its own generation
job run (``tests/integration/test_generate_job.py``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig, fingerprint
from ctrlgen.errors import CtrlgenError

__all__ = ["Cell", "CellGenerateActor", "generate_cells"]

_COLUMNS = ["doc_id", "text", "control_code"]
_MARKER = "_cell.json"


@dataclass(frozen=True)
class Cell:
    """One generation run of a matrix.

    ``output``: the directory its rows are written to (the generation job's ``generated/``); ``input`` and
    ``context_input``: extraction outputs (targets and ICL contexts); ``adapter``: the PEFT adapter directory
    of the ``prefix`` mode, ``finetune_data`` its training examples (the fine-tuning values).
    """

    key: str
    output: str
    seed: int
    modes: tuple[str, ...]
    input: str
    context_input: str
    num_documents: int
    adapter: str | None = None
    finetune_data: str | None = None

    def __post_init__(self) -> None:
        if ("prefix" in self.modes) != (self.adapter is not None):
            raise CtrlgenError(f"cell {self.key}: the prefix mode and an adapter go together (modes {self.modes})")


def _fingerprint(cfg: CtrlgenConfig, cell: Cell) -> str:
    import hashlib

    data = json.dumps([fingerprint(cfg, ("generation", "model")), asdict(cell)], sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def _is_done(cfg: CtrlgenConfig, cell: Cell) -> bool:
    marker = storage.join(cell.output, _MARKER)
    if not storage.exists(marker):
        return False
    return bool(json.loads(storage.read_text(marker)).get("fingerprint") == _fingerprint(cfg, cell))


class CellGenerateActor:
    """``map_batches``: the model loaded once, every adapter on one engine; each batch's rows generated per cell.

    ``cells``: key -> ``{"seed", "modes", "values" (key of ``excludes``), "pool" (rows), "adapter" (name or
    None)}``; ``excludes``: values key -> the corpus' private values (an object reference); ``adapters``: name ->
    adapter directory; ``finetune``: adapter name -> its fine-tuning value index (an object reference).
    """

    def __init__(
        self,
        cfg_json: str,
        cells: dict[str, dict[str, Any]],
        excludes: dict[str, Any],
        adapters: dict[str, str],
        finetune: dict[str, Any],
    ) -> None:
        from ctrlgen.generation.icl import build_pool
        from ray_jobs.generate import _resolve_index, load_generation_engine

        self.cfg = CtrlgenConfig.model_validate_json(cfg_json)
        g = self.cfg.generation
        self.engine, self.tokenizer = load_generation_engine(self.cfg, adapters)
        self.finetune = {name: _resolve_index(ref) for name, ref in finetune.items()}
        self.cells = cells
        self.pools = {k: build_pool(c["pool"], self.tokenizer, g.max_context_tokens) for k, c in cells.items()}
        self.excludes = excludes
        self.fictional: dict[tuple[str, int], Any] = {}
        self.banned: dict[str, dict[str, Any]] = {k: {} for k in cells}  # per cell: a setting's values differ
        self.done = 0

    def _fictional(self, values: str, seed: int) -> Any:
        import ray

        from ctrlgen.fictional import FictionalCodes

        if (values, seed) not in self.fictional:
            exclude = self.excludes[values]
            if isinstance(exclude, ray.ObjectRef):  # fetched once per actor
                exclude = self.excludes[values] = ray.get(exclude)
            self.fictional[(values, seed)] = FictionalCodes(seed, exclude, same_counts=self.cfg.generation.same_counts)
        return self.fictional[(values, seed)]

    def __call__(self, batch: pa.Table) -> pa.Table:
        from ctrlgen.generation.icl import GENERATED_SCHEMA, generate_rows
        from ray_jobs.metrics import record_generate

        parts = []
        keys = batch.column("cell")
        for key in sorted(set(keys.to_pylist())):
            rows = batch.filter(pc.equal(keys, key)).drop_columns(["cell"]).to_pylist()
            c = self.cells[key]
            self.done += len(rows)

            def progress(line: str, key: str = key) -> None:
                print(f"[generate-cells actor {os.getpid()}] {key}: {line} (documents so far: {self.done})", flush=True)

            g = self.cfg.generation.model_copy(update={"seed": c["seed"], "modes": list(c["modes"])})
            adapter = c["adapter"]
            out = generate_rows(
                rows, self.pools[key], self.engine, self.tokenizer, g, self._fictional(c["values"], c["seed"]),
                progress, finetune_values=self.finetune.get(adapter, ()), banned_cache=self.banned[key],
                adapter=adapter or "",
            )  # fmt: skip
            record_generate(out)
            parts.append(out.append_column("cell", pa.array([key] * out.num_rows, pa.string())))
        if not parts:
            return GENERATED_SCHEMA.empty_table().append_column("cell", pa.array([], pa.string()))
        return pa.concat_tables(parts)


def _log(msg: str) -> None:
    print(f"generate-cells: {msg}", file=sys.stderr, flush=True)


def generate_cells(cfg: CtrlgenConfig, cells: list[Cell], resume: bool = False) -> dict[str, int]:
    """Generate every cell in one Ray Data job (module doc); returns rows written per cell key (0 for a cell
    skipped by ``resume``). ``cfg.generation`` gives everything but the cells' seeds, modes, inputs and
    ``num_documents``; Ray must be initialised."""
    import ray

    from ray_jobs.common import even_pool, extraction_input, has_code, reset_dir, seeded_sample, values_of
    from ray_jobs.generate import _merge_values, finetune_index

    g = cfg.generation
    t0 = time.perf_counter()
    if len({c.key for c in cells}) != len(cells):
        raise CtrlgenError("generate-cells: cell keys must be distinct")
    todo = [c for c in cells if not (resume and _is_done(cfg, c))]
    if len(todo) < len(cells):
        _log(f"{len(cells) - len(todo)} of {len(cells)} cells already generated (resume): skipped")
    written = {c.key: 0 for c in cells}
    if not todo:
        return written
    inputs = {p: extraction_input(cfg, p, "generate-cells input") for c in todo for p in (c.input, c.context_input)}
    given = {c.key: c for c in todo}  # as the caller named them: the resume fingerprint
    todo = [replace(c, input=inputs[c.input], context_input=inputs[c.context_input]) for c in todo]
    for c in todo:  # checked before anything runs
        if c.adapter is not None:
            if not storage.exists(storage.join(c.adapter, "adapter_config.json")):
                raise CtrlgenError(f"cell {c.key}: the prefix mode needs a PEFT adapter; {c.adapter} has none")
            if not c.finetune_data or not storage.parquet_files(c.finetune_data, within="status=ok"):
                raise CtrlgenError(f"cell {c.key}: {c.finetune_data} holds no training examples")

    def read(path: str) -> Any:
        return ray.data.read_parquet(path).select_columns(_COLUMNS)

    def eligible(path: str) -> Any:
        return read(path).map_batches(has_code, batch_format="pyarrow") if g.require_code else read(path)

    # 1. The private values of each (targets, contexts) pair of inputs: one reference each.
    excludes: dict[str, Any] = {}
    value_key: dict[str, str] = {}
    for c in todo:
        pair = json.dumps([c.input, c.context_input])
        if pair not in value_key:
            value_key[pair] = f"values{len(value_key)}"
            srcs = dict.fromkeys([c.input, c.context_input])
            refs = [r for s in srcs for r in read(s).map_batches(values_of, batch_format="pyarrow").to_arrow_refs()]
            excludes[value_key[pair]] = _merge_values.remote(*refs)
    # 2. Pools and targets per cell; the fine-tuning index per adapter.
    adapters: dict[str, str] = {}
    finetune: dict[str, Any] = {}
    specs: dict[str, dict[str, Any]] = {}
    targets: list[dict[str, Any]] = []
    for c in todo:
        icl = any(m != "prefix" for m in c.modes)
        pool = seeded_sample(eligible(c.context_input), g.context_pool_size, c.seed, "pool", _COLUMNS) if icl else []
        if icl and len(pool) < g.n_context + 1:
            raise CtrlgenError(
                f"cell {c.key}: only {len(pool)} eligible documents in {c.context_input}; ICL needs at least "
                f"{g.n_context + 1}"
            )
        name = None
        if c.adapter is not None:
            name = next((n for n, p in adapters.items() if p == c.adapter), f"adapter{len(adapters)}")
            if name not in adapters:
                adapters[name] = c.adapter
                finetune[name], _ = finetune_index(str(c.finetune_data))
        rows = seeded_sample(eligible(c.input), c.num_documents, c.seed, "targets", _COLUMNS)
        targets += [{**r, "cell": c.key} for r in rows]
        specs[c.key] = {"seed": c.seed, "modes": list(c.modes), "pool": pool, "adapter": name,
                        "values": value_key[json.dumps([c.input, c.context_input])], "targets": len(rows)}  # fmt: skip
    n_rows = sum(s["targets"] * len(s["modes"]) for s in specs.values())
    _log(f"{len(todo)} cells, {len(targets):,} targets, {n_rows:,} outputs, {len(adapters)} adapters, one actor pool "
         f"of {g.num_actors}")  # fmt: skip
    # 3. One pass over every target.
    tables: list[pa.Table] = []
    if targets:
        per_block = g.batch_size
        ds = ray.data.from_items(targets, override_num_blocks=max(1, -(-len(targets) // per_block)))
        kwargs = {"cfg_json": cfg.model_dump_json(), "cells": specs, "excludes": excludes, "adapters": adapters,
                  "finetune": finetune}  # fmt: skip
        out_ds = ds.map_batches(
            CellGenerateActor,
            fn_constructor_kwargs=kwargs,
            batch_size=per_block,
            batch_format="pyarrow",
            num_cpus=g.actor_num_cpus,
            num_gpus=g.actor_num_gpus or None,
            compute=even_pool(g.num_actors),
        )
        tables = [t for t in ray.get(out_ds.to_arrow_refs()) if t.num_rows]
    table = pa.concat_tables(tables) if tables else None
    # 4. Each cell's rows in the generation job's layout, its marker last.
    from ctrlgen.generation.icl import GENERATED_SCHEMA
    from ray_jobs.generate import GeneratedSink

    for c in todo:
        mine = table.filter(pc.equal(table.column("cell"), c.key)).drop_columns(["cell"]) if table else None
        got = mine.num_rows if mine is not None else 0
        want = specs[c.key]["targets"] * len(c.modes)
        if got != want:
            raise CtrlgenError(f"cell {c.key}: {got} rows generated, expected {want} (targets x modes)")
        reset_dir(c.output)
        GeneratedSink.write_table(c.output, mine if mine is not None else GENERATED_SCHEMA.empty_table(), "part-0")
        storage.write_text(
            storage.join(c.output, _MARKER), json.dumps({"fingerprint": _fingerprint(cfg, given[c.key])}) + "\n"
        )
        written[c.key] = got
    _log(f"{sum(written.values()):,} rows of {len(todo)} cells written in {time.perf_counter() - t0:.1f} s")
    return written
