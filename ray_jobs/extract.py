"""Ray Data job: entity extraction at MIMIC scale.

Reads NOTEEVENTS Parquet/CSV shards (or documents already in the ctrlgen schema)
in parallel, runs :func:`ctrlgen.extract.stage.extract_rows` in an actor pool
(the extractor - Presidio's analyzer in the unknown setting - is loaded once per
actor), and writes Parquet partitioned by ``status``:

    <output_dir>/extracted/status=ok/*.parquet           documents, entities, control_code
    <output_dir>/extracted/status=quarantined/*.parquet  doc_id, reason, location (no text)

Corpora in the small special formats (PhysioNet, TAB, ACI-Bench) are read by the
core readers on the driver and handed to Ray as Arrow. The job prints counts in /
out / quarantined and entities by category; Ray Data shows progress bars.

    python -m ray_jobs.extract --config configs/extract_demo.yaml extraction.setting=unknown
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Datasink

from ctrlgen import storage
from ctrlgen.config import CtrlgenConfig, MimicCorpusConfig
from ctrlgen.corpora import read_corpus
from ctrlgen.corpora.mimic import noteevent_shards, open_parquet
from ctrlgen.errors import CorpusError, CtrlgenError
from ctrlgen.schema import DOCUMENT_SCHEMA, Document, Quarantined

__all__ = ["ExtractActor", "ExtractSummary", "StatusParquetSink", "main", "run"]


class ExtractActor:
    """Callable class for ``map_batches``: loads the extractor once, then handles blocks.

    It takes whole blocks and runs the core function on ``batch_size``-row slices itself:
    a ``map_batches`` batch size would keep Ray Data from fusing the Parquet read into the
    actors (each read task's output would go through the object store to an actor).
    """

    def __init__(self, cfg_json: str, input_kind: str, models: dict[str, tuple[str, Any]] | None = None) -> None:
        import gc

        from ctrlgen.extract import make_extractor

        self.cfg = _drivers_models(CtrlgenConfig.model_validate_json(cfg_json), models or {})
        self.input_kind = input_kind
        self.extractor = make_extractor(self.cfg.extraction, self.cfg.nlp.spacy_model, self.cfg.corpus.identifiers)
        # Everything alive now (Ray's modules, the extractor, spaCy's model) lives as long as the
        # actor: keep it out of the garbage collector's full scans, which otherwise walk it all
        # again and again while the batches allocate.
        gc.freeze()

    def __call__(self, block: pa.Table) -> pa.Table:
        from ctrlgen.extract.stage import extract_rows
        from ray_jobs.metrics import record_extract

        n = self.cfg.extraction.batch_size
        parts = [
            extract_rows(block.slice(i, n).to_pylist(), self.extractor, self.cfg.corpus, self.input_kind, "ray-data")
            for i in range(0, max(block.num_rows, 1), n)
        ]
        # One chunk per column: Ray's Arrow serializer handles every chunk of every (nested)
        # column on its own, 25x the CPU of this copy for a block of 200 batches.
        out = pa.concat_tables(parts).combine_chunks()
        record_extract(out)
        return out


def ship_models(cfg: CtrlgenConfig) -> dict[str, tuple[str, Any]]:
    """The trained models the driver's engine loads (``extraction.ner_model``, ``extraction.ner_veto``), by setting:
    each one's digest and its files put in the object store once (``ExtractActor``'s ``models``)."""
    import ray

    from ctrlgen.extract.ner import files_digest
    from ctrlgen.extract.shipping import model_files, trained_models

    shipped = {}
    for setting, path in trained_models(cfg.extraction).items():
        files = model_files(path)  # read once: hashed and put
        shipped[setting] = (files_digest(files), ray.put(files))
    return shipped


def _drivers_models(cfg: CtrlgenConfig, models: dict[str, tuple[str, Any]]) -> CtrlgenConfig:
    """``cfg`` loading the driver's models (:func:`ship_models`): this node's copy where it has their digest, else
    the driver's files, fetched from the object store and written once under the cache (said on the actor's log)."""
    from functools import partial

    import ray

    from ctrlgen.config import default_cache_dir
    from ctrlgen.extract.shipping import resolve_model

    paths = {}
    for setting, (digest, ref) in models.items():
        path, note = resolve_model(
            getattr(cfg.extraction, setting), digest, partial(ray.get, ref), default_cache_dir() / "extraction-models"
        )
        if note:
            print(f"extract actor: {note}", file=sys.stderr, flush=True)
        paths[setting] = path
    return cfg.model_copy(update={"extraction": cfg.extraction.model_copy(update=paths)}) if paths else cfg


class StatusParquetSink(Datasink[None]):
    """Writes extracted rows as Parquet partitioned by ``status`` (hive layout, the column
    itself not stored): ``<path>/status=ok/*.parquet`` and ``<path>/status=quarantined/``.

    Each write task gathers about ``rows_per_file`` rows, then writes one file per status,
    named by this write's id and the task's index (a retried task overwrites its own file).
    Ray Data's ``write_parquet(partition_cols=...)`` does the same through Arrow's dataset
    writer, which cost twice the CPU of filtering by status and writing each table.
    """

    STATUSES = ("ok", "quarantined")

    def __init__(self, path: str, rows_per_file: int) -> None:
        import uuid

        self.path = str(path)
        self.rows_per_file = rows_per_file
        self.write_id = uuid.uuid4().hex[:12]

    @property
    def min_rows_per_write(self) -> int:
        return self.rows_per_file

    def write(self, blocks: Iterable[Any], ctx: Any) -> None:
        tables = [b for b in blocks if b.num_rows]
        if not tables:
            return
        ok, rest = _split_ok(pa.concat_tables(tables))
        unknown = rest.num_rows - int(pc.sum(pc.equal(rest.column("status"), "quarantined")).as_py() or 0)
        if unknown:  # extract_rows only makes these two: never drop rows silently
            raise CtrlgenError(f"{unknown} extracted rows with a status other than {self.STATUSES}")
        for value, part in zip(self.STATUSES, (ok, rest), strict=True):
            if part.num_rows:
                name = f"{self.write_id}_{ctx.task_idx:06d}.parquet"
                storage.write_parquet(part.drop_columns(["status"]), storage.join(self.path, f"status={value}", name))


def _split_ok(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The rows with status ``ok`` and the others. Quarantined rows are rare: they are
    copied out, and the ok rows are the zero-copy slices between them (a filter would copy
    every note's text once more)."""
    not_ok = pc.fill_null(pc.invert(pc.equal(table.column("status"), "ok")), True)  # a null status is not ok
    where = pc.indices_nonzero(not_ok)
    rest = table.take(where)
    if not rest.num_rows:
        return table, rest
    pieces, start = [], 0
    for i in where.to_pylist():
        if i > start:
            pieces.append(table.slice(start, i - start))
        start = i + 1
    pieces.append(table.slice(start))
    return pa.concat_tables(pieces), rest


@dataclass
class ExtractSummary:
    rows_in: int
    documents: int
    quarantined: int
    entities_by_category: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    output: str = ""
    without_entities: int = 0  # documents out with no private entity
    warnings: list[str] = field(default_factory=list)
    #: the digest of each trained model every actor loaded (the driver's), by setting
    models: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        cats = ", ".join(f"{c} {n}" for c, n in sorted(self.entities_by_category.items()))
        return (
            f"rows in {self.rows_in:,} = documents out {self.documents:,} + quarantined {self.quarantined:,}\n"
            f"entities {sum(self.entities_by_category.values()):,}"
            + (f" ({cats})" if cats else "")
            + f"\nwritten to {self.output} in {self.seconds:.1f} s"
            + (
                "\nmodels (the driver's, loaded by every actor): "
                + ", ".join(f"extraction.{f} sha256 {d[:16]}" for f, d in self.models.items())
                if self.models
                else ""
            )
            + "".join(f"\nwarning: {w}" for w in self.warnings)
        )


def _read_parquet(paths: list[str], rows_per_block: int, min_blocks: int) -> Any:
    """Local Parquet shards as a Ray dataset in blocks of at most about ``rows_per_block``
    rows, and at least ``min_blocks`` blocks (when there are enough rows).

    The row count comes from the shards' footers (read here, on the driver), so the read
    tasks themselves cut the blocks: no separate repartition step. When that needs no more
    blocks than there are files, every read task reads whole files and Ray Data fuses the
    read into the extraction actors (no input block goes through the object store).
    The Parquet reader (V1 unless ``RAY_DATA_USE_DATASOURCE_V2`` is set) is the one every job uses
    (:func:`ray_jobs.runtime.parquet_reader`, set by ``init_ray``).
    """
    import ray

    rows = sum(open_parquet(p).metadata.num_rows for p in paths)
    blocks = min(max(-(-rows // rows_per_block), min_blocks), max(rows, 1))
    return ray.data.read_parquet(paths, override_num_blocks=blocks)


def _dataset(
    cfg: CtrlgenConfig, driver_quarantine: list[Quarantined], rows_per_block: int, read_warnings: list[str]
) -> tuple[Any, str, bool]:
    """The input as a Ray dataset, what its rows are (noteevents | documents), and whether
    its blocks already hold about ``rows_per_block`` rows (warnings about the read go to ``read_warnings``)."""
    import ray

    corpus = cfg.corpus
    if isinstance(corpus, MimicCorpusConfig):
        path = corpus.path
        files = _shards(path)
        parquet = [f for f in files if f.endswith(".parquet")]
        csvs = [f for f in files if f.endswith((".csv", ".csv.gz"))]
        if not parquet and not csvs:
            raise CtrlgenError(f"{path} holds no NOTEEVENTS .parquet or .csv files")
        if parquet and not csvs:
            shards = [f for f in parquet if os.path.basename(f).startswith("documents-")]
            if shards:  # ctrlgen's document shards (`ctrlgen ingest`); their quarantine.parquet is not input
                kind, parquet = "documents", shards
            else:
                kind = "noteevents"
            # Several blocks per actor, so that all of them get work and finish close together.
            return _read_parquet(parquet, rows_per_block, 4 * cfg.extraction.num_actors), kind, True
        from ctrlgen.corpora._common import csv_header

        for f in csvs:  # each header, here: an unreadable file fails before any task starts
            csv_header(f)
        read_warnings.extend(_compressed_csv_warnings(csvs))
        # One read task per file, as Ray Data's own CSV reader would, but through ctrlgen's reader: a malformed
        # row fails the file with its row number and shape, never with the row's text (Arrow's message quotes it).
        files_ds = ray.data.from_items([{"path": f} for f in csvs], override_num_blocks=len(csvs))
        return files_ds.map_batches(_read_csv_files, batch_size=1, batch_format="pyarrow"), "noteevents", False
    docs: list[dict[str, Any]] = []
    for rec in read_corpus(corpus):
        if isinstance(rec, Document):
            docs.append(rec.to_row())
        else:
            driver_quarantine.append(rec)
    table = pa.Table.from_pylist(docs, schema=DOCUMENT_SCHEMA)
    return ray.data.from_arrow(table), "documents", False


def _read_csv_files(batch: pa.Table) -> Iterator[pa.Table]:
    """Ray Data task: each NOTEEVENTS CSV path of ``batch`` read as Arrow tables with every column as bytes
    (``CorpusError`` naming the file and the row after which it is malformed)."""
    from ctrlgen.corpora._common import csv_error_summary, open_csv_as_bytes

    for path in batch.column("path").to_pylist():
        _, reader = open_csv_as_bytes(path)
        row = 0
        try:
            for rb in reader:
                row += rb.num_rows
                yield pa.Table.from_batches([rb])
        except pa.ArrowInvalid as exc:
            raise CorpusError(f"{path} is not a well-formed CSV after data row {row} ({csv_error_summary(exc)})") from None


#: A gzip NOTEEVENTS file above this size gets a warning: one task decompresses and parses it whole.
GZIP_WARN_BYTES = 64 * 2**20


def _compressed_csv_warnings(csvs: list[str], limit: int = GZIP_WARN_BYTES) -> list[str]:
    """Large ``.csv.gz`` inputs: gzip cannot be split, so one Ray task reads each such file from start to end
    (extraction after it still runs in parallel). MIMIC-III's NOTEEVENTS.csv.gz (~1.1 GB) reads in minutes this
    way, every time the corpus is read; `ctrlgen ingest` once writes Parquet shards that later runs read in
    parallel."""
    big = [(f, storage.size(f)) for f in csvs if f.endswith(".gz")]
    return [
        f"{os.path.basename(f)} ({n / 2**20:,.0f} MiB gzip) is decompressed and parsed by one task (gzip cannot be "
        "split), on every run: for a corpus read more than once, run `ctrlgen ingest` on it once and set "
        "corpus.path to its Parquet shards (or gunzip it; docs/quickstart.md)"
        for f, n in big
        if n >= limit
    ]


def _shards(path: str) -> list[str]:
    """The NOTEEVENTS files at a local path or a URI (a file, or a directory of shards), sorted."""
    if not storage.is_uri(path):
        return [str(f) for f in noteevent_shards(Path(path))]
    if storage.exists(path) and not storage.is_dir(path):
        return [path]
    files = [f for f in storage.list_files(path, recursive=False) if f.endswith((".parquet", ".csv", ".csv.gz"))]
    if not files:
        raise CtrlgenError(f"NOTEEVENTS location {path} holds no .parquet or .csv files (or does not exist)")
    return files


def _count(out: str, driver_quarantine: list[Quarantined]) -> tuple[int, int, Counter[str], int]:
    """Documents out, quarantined, entities per category and documents without any entity."""
    ok = empty = 0
    cats: Counter[str] = Counter()
    for f in storage.list_files(storage.join(out, "status=ok"), ".parquet"):
        # Only the entities' category leaf column is read.
        table = storage.parquet_file(f).read(columns=["entities.list.element.category"])
        ok += table.num_rows
        for chunk in table.column("entities").chunks:
            empty += pc.sum(pc.equal(pc.list_value_length(chunk), 0)).as_py() or 0
            for v in pc.value_counts(pc.list_flatten(chunk).field("category")):
                cats[v["values"].as_py()] += v["counts"].as_py()
    bad = storage.list_files(storage.join(out, "status=quarantined"), ".parquet")
    quarantined = storage.parquet_rows(bad)
    return ok, quarantined + len(driver_quarantine), cats, empty


def _warnings(cfg: CtrlgenConfig, out: str, documents: int, empty: int) -> list[str]:
    """What a user running their own notes should hear: most notes without entities; raw PHI in the known setting."""
    from ctrlgen.corpora.mimic import raw_phi_share

    found: list[str] = []
    if documents and empty / documents > 0.5:
        how = (
            "the known setting counts only the corpus' own annotations (MIMIC: [**...**] placeholders); notes with "
            "names and dates written out need extraction.setting=unknown"
            if cfg.extraction.setting == "known"
            else "check extraction.recognizers and corpus.identifiers (direct protects no dates or places)"
        )
        found.append(f"{empty:,} of {documents:,} notes ({100 * empty / documents:.0f}%) have no private entity: "
                     f"{how} (docs/quickstart.md)")  # fmt: skip
    if cfg.extraction.setting == "known" and cfg.corpus.format == "mimic" and documents:
        files = storage.list_files(storage.join(out, "status=ok"), ".parquet")
        texts = storage.parquet_file(files[0]).read(columns=["text"]).column("text").to_pylist()[:500] if files else []
        share = raw_phi_share([t or "" for t in texts])
        if share > 0.2:
            found.append(
                f"{100 * share:.0f}% of the notes sampled hold names, dates or record numbers written out (not in "
                "[**...**] placeholders), which the known setting does not see: use extraction.setting=unknown "
                "for raw notes (docs/quickstart.md)"
            )
    return found


def _default_rows_per_block(cfg: CtrlgenConfig) -> int:
    return cfg.extraction.batch_size * (1 if cfg.extraction.setting == "unknown" else 200)


def run(cfg: CtrlgenConfig) -> ExtractSummary:
    """Read -> extract in an actor pool -> write partitioned Parquet -> count."""
    import ray

    from ctrlgen.demo import resolve_corpus
    from ray_jobs.runtime import init_ray
    from ray_jobs.submit import absolute_paths

    cfg = absolute_paths(resolve_corpus(cfg))[0]  # actors may run in another working directory
    from ctrlgen.extract.ner_setup import ensure_ner_model

    ensure_ner_model(cfg)  # an untrained clinical NER is trained once, from extraction.ner_training.data
    init_ray(cfg)
    t0 = time.perf_counter()
    driver_quarantine: list[Quarantined] = []
    read_warnings: list[str] = []
    ex = cfg.extraction
    # Presidio blocks are one batch (seconds of work each), so that both actors get work and
    # finish together; cheap placeholder blocks are larger (about 50k rows: a generated shard),
    # or Ray's per-block cost dominates.
    rows_per_block = ex.rows_per_block or _default_rows_per_block(cfg)
    # every actor loads the driver's models, whatever its node's `make setup` trained (ctrlgen.extract.shipping)
    models = ship_models(cfg)
    ds, input_kind, sized = _dataset(cfg, driver_quarantine, rows_per_block, read_warnings)
    for w in read_warnings:  # before the read starts: it can take minutes
        print(f"extract: warning: {w}", file=sys.stderr, flush=True)
    if not sized:
        # CSV and driver-read corpora can arrive as one block, which only one actor would
        # get: stream them into bounded blocks (no shuffle, no barrier).
        ds = ds.repartition(target_num_rows_per_block=rows_per_block)
    out_ds = ds.map_batches(
        ExtractActor,
        fn_constructor_kwargs={"cfg_json": cfg.model_dump_json(), "input_kind": input_kind, "models": models},
        batch_size=None,  # whole blocks: the actor slices them into batch_size rows itself
        batch_format="pyarrow",
        num_cpus=ex.actor_num_cpus,
        num_gpus=ex.actor_num_gpus or None,
        compute=ray.data.ActorPoolStrategy(size=ex.num_actors),
    )
    out = storage.join(storage.absolute(cfg.output_dir), "extracted")
    storage.remove(out)
    # One-batch blocks would make one small file each: the writer gathers rows_per_file rows.
    out_ds.write_datasink(StatusParquetSink(out, ex.rows_per_file))
    if driver_quarantine:
        from ctrlgen.schema import quarantine_to_table

        storage.write_parquet(quarantine_to_table(driver_quarantine), storage.join(out, "reader-quarantine.parquet"))
    ok, bad, cats, empty = _count(out, driver_quarantine)
    summary = ExtractSummary(ok + bad, ok, bad, cats, time.perf_counter() - t0, out, empty)
    summary.models = {f: digest for f, (digest, _) in models.items()}
    found = _warnings(cfg, out, ok, empty)
    for w in found:
        print(f"extract: warning: {w}", file=sys.stderr, flush=True)
    summary.warnings = read_warnings + found
    return summary


def main(argv: list[str] | None = None) -> int:
    from ray_jobs.common import job_main

    return job_main("extract", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())
