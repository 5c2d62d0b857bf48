"""The project's own MIMIC-format demo corpus: NOTEEVENTS rows with ``[**...**]`` placeholders.

Notes are assembled from the project's templates (below) and written in batches
to Parquet shards (or one CSV), so millions of notes never sit in memory. Every
row draws from an RNG seeded by ``(seed, ROW_ID)``: the same seed gives the same
notes whatever the batch or shard size, and any slice can be made on its own.

Example:
    >>> rows = generate_batch(seed=0, start_row=0, n=2)
    >>> sorted(rows) == sorted(NOTE_COLUMNS)
    True
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from ctrlgen.config import CtrlgenConfig, DemoCorpusConfig, default_cache_dir

__all__ = ["NOTE_COLUMNS", "NOTE_SCHEMA", "demo_corpus_dir", "generate_batch", "resolve_corpus", "write_demo_corpus"]

NOTE_SCHEMA = pa.schema(
    [
        ("ROW_ID", pa.int64()),
        ("SUBJECT_ID", pa.int64()),
        ("HADM_ID", pa.int64()),
        ("CHARTDATE", pa.string()),
        ("CHARTTIME", pa.string()),
        ("STORETIME", pa.string()),
        ("CATEGORY", pa.string()),
        ("DESCRIPTION", pa.string()),
        ("CGID", pa.int64()),
        ("ISERROR", pa.int64()),
        ("TEXT", pa.string()),
    ]
)
NOTE_COLUMNS = tuple(NOTE_SCHEMA.names)
#: Share of notes marked ISERROR=1, as a few real MIMIC notes are.
ISERROR_RATE = 0.002

# ---- the project's own word lists (clinical vocabulary, not PHI) ----------------
_CONDITIONS = (
    "congestive heart failure",
    "atrial fibrillation",
    "COPD exacerbation",
    "community acquired pneumonia",
    "urosepsis",
    "acute kidney injury",
    "diabetic ketoacidosis",
    "upper GI bleed",
    "NSTEMI",
    "pulmonary embolism",
    "cellulitis",
    "alcohol withdrawal",
    "hepatic encephalopathy",
    "small bowel obstruction",
    "syncope",
    "hypertensive urgency",
    "acute pancreatitis",
    "CVA",
    "subdural hematoma",
    "aspiration pneumonia",
)
_HISTORY = (
    "CAD s/p CABG",
    "HTN",
    "hyperlipidemia",
    "type 2 diabetes",
    "CKD stage III",
    "COPD on home O2",
    "afib on coumadin",
    "hypothyroidism",
    "depression",
    "GERD",
    "OSA on CPAP",
    "prior CVA",
    "PVD",
    "breast cancer s/p lumpectomy",
    "BPH",
    "osteoarthritis",
    "cirrhosis",
    "asthma",
)
_MEDS = (
    "metoprolol",
    "lisinopril",
    "furosemide",
    "heparin gtt",
    "insulin sliding scale",
    "vancomycin",
    "zosyn",
    "ceftriaxone",
    "levofloxacin",
    "pantoprazole",
    "aspirin",
    "atorvastatin",
    "warfarin",
    "lorazepam PRN",
    "morphine PRN",
    "acetaminophen",
    "albuterol nebs",
    "prednisone",
    "lactulose",
    "KCl repletion",
)
_FINDINGS = (
    "lungs with crackles at bases",
    "abd soft, non-tender",
    "trace bilateral LE edema",
    "A&O x3",
    "MAE, follows commands",
    "skin warm and dry",
    "sinus rhythm on monitor",
    "diminished breath sounds on the right",
    "bowel sounds present",
    "pupils equal and reactive",
    "no acute distress",
    "mild confusion overnight",
    "incision clean and dry",
)
_CATEGORIES: tuple[tuple[str, str, float], ...] = (
    ("Nursing/other", "Report", 0.35),
    ("Radiology", "CHEST (PORTABLE AP)", 0.2),
    ("Nursing", "Nursing Progress Note", 0.15),
    ("Physician ", "Physician Resident Progress Note", 0.1),
    ("ECG", "Report", 0.08),
    ("Discharge summary", "Report", 0.07),
    ("Echo", "Report", 0.05),
)

# ---- placeholders, as MIMIC-III writes them -------------------------------------
_NAME = (
    "Known lastname",
    "Last Name (NamePattern1)",
    "First Name (NamePattern1)",
    "Name (NI)",
    "Doctor Last Name",
    "Doctor First Name",
    "Female First Name (un)",
    "Male First Name (un)",
    "Initials (NamePattern4)",
    "Last Name (STitle)",
)
_HOSP = ("Hospital1", "Hospital", "Hospital3", "Hospital Ward Name", "Hospital Unit Name")
_LOC = ("Location (un)", "Location", "Street Address(1)", "State", "Country")
_CODE = ("Telephone/Fax (1)", "Medical Record Number", "Numeric Identifier", "MD Number(1)", "Pager number")


class _Note:
    """Draws placeholders and vocabulary for one batch from one RNG."""

    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def ph(self, types: tuple[str, ...]) -> str:
        return f"[**{self.r.choice(types)} {self.r.randint(1, 9999)}**]"

    def name(self) -> str:
        return self.ph(_NAME)

    def dr(self) -> str:
        return f"Dr. [**{self.r.choice(('Doctor Last Name', 'Last Name (STitle)'))} {self.r.randint(1, 9999)}**]"

    def hosp(self) -> str:
        return self.ph(_HOSP[:3])

    def date(self) -> str:
        r = self.r
        form = r.random()
        if form < 0.5:
            return f"[**{r.randint(2100, 2199)}-{r.randint(1, 12)}-{r.randint(1, 28)}**]"
        if form < 0.85:
            return f"[**{r.randint(1, 12)}-{r.randint(1, 28)}**]"
        return f"[**Month (only) {r.randint(1, 999)}**]"

    def age(self) -> str:
        return "[**Age over 90 **]" if self.r.random() < 0.05 else str(self.r.randint(19, 89))

    def pick(self, seq: tuple[str, ...], k: int = 1) -> str:
        return ", ".join(self.r.sample(seq, k))


def _nursing(n: _Note) -> str:
    r = n.r
    parts = [
        f"{n.age()} y/o {r.choice(('M', 'F'))} admitted from {n.hosp()} with {n.pick(_CONDITIONS)}. "
        f"PMH: {n.pick(_HISTORY, r.randint(2, 5))}.",
    ]
    for sys_name in r.sample(("Neuro", "CV", "Resp", "GI", "GU", "ID", "Skin", "Social"), r.randint(3, 7)):
        if sys_name == "Social":
            parts.append(
                f"Social: {r.choice(('wife', 'husband', 'daughter', 'son', 'HCP'))} {n.name()} "
                f"in to visit, updated by RN; can be reached at {n.ph(_CODE[:1])}."
            )
        else:
            parts.append(f"{sys_name}: {n.pick(_FINDINGS)}; {n.pick(_MEDS)} given as ordered.")
    parts.append(
        f"Plan: {r.choice(('continue current plan', 'wean as tolerated', 'f/u AM labs'))}; discussed with {n.dr()}."
    )
    return "\n".join(parts) + "\n"


def _radiology(n: _Note) -> str:
    r = n.r
    return (
        f"[**{r.randint(2100, 2199)}-{r.randint(1, 12)}-{r.randint(1, 28)}**] "
        f"{r.randint(1, 12)}:{r.randint(0, 59):02d} {r.choice(('AM', 'PM'))}\n"
        f" CHEST (PORTABLE AP)                                             Clip # {n.ph(('Clip Number (Radiology)',))}\n"
        f" Reason: eval for {r.choice(('infiltrate', 'effusion', 'line placement', 'CHF'))}\n"
        f" Admitting Diagnosis: {n.pick(_CONDITIONS).upper()}\n"
        f" ______________________________________________________________________________\n"
        f"                                 FINAL REPORT\n"
        f" INDICATION: {n.age()} year old with {n.pick(_CONDITIONS)}.\n"
        f" COMPARISON: {n.date()}.\n"
        f" FINDINGS: {r.choice(('No new consolidation.', 'Small left effusion.', 'Stable cardiomegaly.', 'ET tube 4 cm above the carina.'))}"
        f" {r.choice(('No pneumothorax.', 'Mild vascular congestion.', 'Lines unchanged.'))}\n"
        f" IMPRESSION: {r.choice(('No acute process.', 'Improving edema.', 'Findings discussed with', 'Unchanged.'))}"
        f"{' ' + n.dr() + ' at ' + str(r.randint(1, 12)) + ':00.' if r.random() < 0.3 else ''}\n"
    )


def _physician(n: _Note) -> str:
    r = n.r
    return (
        f"Chief Complaint: {n.pick(_CONDITIONS)}\n"
        f"24 Hour Events: {r.choice(('none', 'febrile overnight, cultures sent', 'transfused 1 unit PRBC'))}\n"
        f"Allergies: {r.choice(('No Known Drug Allergies', 'Penicillins', 'Sulfa'))}\n"
        f"Medications: {n.pick(_MEDS, r.randint(3, 6))}\n"
        f"Physical Examination: {n.pick(_FINDINGS, r.randint(2, 4))}\n"
        f"Assessment and Plan: {n.age()} yo with {n.pick(_HISTORY, 2)} admitted to {n.ph(_HOSP[3:])} "
        f"on {n.date()} with {n.pick(_CONDITIONS)}.\n"
        f"Code status: {r.choice(('Full code', 'DNR/DNI'))}. Dispo: {r.choice(('ICU', 'floor when stable', 'rehab'))}.\n"
        f"Attending: {n.name()} {n.name()}, pager {n.ph(('Pager number',))}\n"
    )


def _ecg(n: _Note) -> str:
    r = n.r
    return (
        f"{r.choice(('Sinus rhythm', 'Atrial fibrillation', 'Sinus tachycardia'))}. "
        f"{r.choice(('Left axis deviation.', 'Nonspecific ST-T wave changes.', 'Normal ECG.'))} "
        f"Since the previous tracing of {n.date()} {r.choice(('no significant change.', 'rate is faster.'))}\n"
    )


def _discharge(n: _Note) -> str:
    r = n.r
    course = " ".join(
        f"# {c}: treated with {n.pick(_MEDS)}, {r.choice(('improved', 'resolved', 'stable'))}."
        for c in r.sample(_CONDITIONS, r.randint(2, 5))
    )
    return (
        f"Admission Date:  {n.date()}              Discharge Date:   {n.date()}\n\n"
        f"Date of Birth:  {n.date()}             Sex:   {r.choice(('M', 'F'))}\n\n"
        f"Service: MEDICINE\n\nHISTORY OF PRESENT ILLNESS:  {n.name()} is a {n.age()} year old with "
        f"{n.pick(_HISTORY, 3)} who presented to {n.hosp()} with {n.pick(_CONDITIONS)}.\n\n"
        f"HOSPITAL COURSE: {course}\n\n"
        f"DISCHARGE MEDICATIONS: {n.pick(_MEDS, r.randint(4, 8))}.\n\n"
        f"FOLLOW-UP: {n.dr()} at {n.ph(_HOSP[:3])}, {n.ph(_LOC)}; call {n.ph(_CODE[:1])}.\n"
        f"MRN {n.ph(('Medical Record Number',))}\n\n"
        f"                             {n.name()}, M.D.  {n.ph(('MD Number(1)',))}\n"
        f"Dictated By:{n.name()}\nMEDQUIST36\nD:  {n.date()}  T:  {n.date()}\nJOB#:  {n.ph(('Job Number',))}\n"
    )


def _echo(n: _Note) -> str:
    r = n.r
    return (
        f"PATIENT/TEST INFORMATION:\nIndication: {n.pick(_CONDITIONS)}.\nDate/Time: {n.date()} at {r.randint(8, 17)}:00\n"
        f"Test: TTE (Complete)\nLEFT VENTRICLE: {r.choice(('Normal LV wall thickness.', 'Mild symmetric LVH.'))} "
        f"LVEF {r.randint(15, 70)}%.\nConclusions: {r.choice(('No change from prior.', 'Moderate MR.', 'Small pericardial effusion.'))}\n"
        f"Electronically signed by {n.dr()}, interpreting physician\n"
    )


_BUILDERS: dict[str, Callable[[_Note], str]] = {
    "Nursing/other": _nursing,
    "Nursing": _nursing,
    "Radiology": _radiology,
    "Physician ": _physician,
    "ECG": _ecg,
    "Discharge summary": _discharge,
    "Echo": _echo,
}


def generate_batch(seed: int, start_row: int, n: int) -> dict[str, list[Any]]:
    """Generate NOTEEVENTS rows ``start_row+1 .. start_row+n`` (columns -> lists)."""
    rng = random.Random()
    note = _Note(rng)
    cats = [c for c, _, _ in _CATEGORIES]
    weights = [w for _, _, w in _CATEGORIES]
    descr = {c: d for c, d, _ in _CATEGORIES}
    cols: dict[str, list[Any]] = {c: [] for c in NOTE_COLUMNS}
    for i in range(n):
        row_id = start_row + i + 1
        rng.seed(seed * 10**12 + row_id)
        cat = rng.choices(cats, weights)[0]
        subject = rng.randint(1, max(10, row_id // 5))
        y, m, d = rng.randint(2100, 2199), rng.randint(1, 12), rng.randint(1, 28)
        date = f"{y}-{m:02d}-{d:02d}"
        hh, mm = rng.randint(0, 23), rng.randint(0, 59)
        cols["ROW_ID"].append(row_id)
        cols["SUBJECT_ID"].append(subject)
        cols["HADM_ID"].append(100000 + subject * 3 + rng.randint(0, 2) if rng.random() > 0.05 else None)
        cols["CHARTDATE"].append(date)
        cols["CHARTTIME"].append(f"{date} {hh:02d}:{mm:02d}:00" if cat != "Discharge summary" else None)
        cols["STORETIME"].append(
            f"{date} {hh:02d}:{min(59, mm + 7):02d}:00" if cat.startswith(("Nursing", "Phys")) else None
        )
        cols["CATEGORY"].append(cat)
        cols["DESCRIPTION"].append(descr[cat])
        cols["CGID"].append(rng.randint(14000, 21000) if cat.startswith(("Nursing", "Phys")) else None)
        cols["ISERROR"].append(1 if rng.random() < ISERROR_RATE else None)
        cols["TEXT"].append(_BUILDERS[cat](note))
    return cols


def demo_corpus_dir(cfg: DemoCorpusConfig) -> Path:
    return Path(cfg.output_dir) if cfg.output_dir else default_cache_dir() / "demo" / f"{cfg.n_notes}-{cfg.seed}"


def write_demo_corpus(cfg: DemoCorpusConfig, progress: bool = True) -> Path:
    """Write the demo corpus (once: an existing complete corpus is reused); return its directory.

    Parquet shards ``noteevents-00000.parquet``... of ``shard_size`` notes, or one
    ``NOTEEVENTS.csv``. A ``_SUCCESS`` marker is written last, so an interrupted
    run is redone rather than half-read.
    """
    out = demo_corpus_dir(cfg)
    marker = out / "_SUCCESS"
    if marker.is_file() and marker.read_text().strip() == _fingerprint(cfg):
        return out
    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("noteevents-*.parquet")) + list(out.glob("NOTEEVENTS.csv")):
        old.unlink()
    t0 = time.perf_counter()
    written, shard = 0, -1
    writer: pq.ParquetWriter | pacsv.CSVWriter | None = None
    next_report = 0.0
    try:
        while written < cfg.n_notes:
            if cfg.file_format == "parquet" and written // cfg.shard_size != shard:
                shard = written // cfg.shard_size
                if writer is not None:
                    writer.close()
                writer = pq.ParquetWriter(out / f"noteevents-{shard:05d}.parquet", NOTE_SCHEMA, compression="zstd")
            elif writer is None:
                writer = pacsv.CSVWriter(out / "NOTEEVENTS.csv", NOTE_SCHEMA)
            n = min(cfg.batch_size, cfg.n_notes - written)
            if cfg.file_format == "parquet":
                n = min(n, cfg.shard_size - written % cfg.shard_size)
            table = pa.Table.from_pydict(generate_batch(cfg.seed, written, n), schema=NOTE_SCHEMA)
            writer.write_table(table)
            written += n
            elapsed = time.perf_counter() - t0
            if progress and (elapsed >= next_report or written == cfg.n_notes):
                rate = written / max(elapsed, 1e-9)
                print(
                    f"[demo-corpus] {written:,}/{cfg.n_notes:,} notes ({rate:,.0f} notes/s)",
                    file=sys.stderr,
                    flush=True,
                )
                next_report = elapsed + 5.0
    finally:
        if writer is not None:
            writer.close()
    marker.write_text(_fingerprint(cfg))
    return out


def resolve_corpus(cfg: CtrlgenConfig) -> CtrlgenConfig:
    """``corpus.format: mimic`` with ``path: demo`` -> the generated demo corpus (written once)."""
    corpus = cfg.corpus
    if corpus.format != "mimic" or corpus.path != "demo":
        return cfg
    path = str(write_demo_corpus(cfg.demo_corpus))
    return cfg.model_copy(update={"corpus": corpus.model_copy(update={"path": path})})


def _fingerprint(cfg: DemoCorpusConfig) -> str:
    return f"n_notes={cfg.n_notes} seed={cfg.seed} shard_size={cfg.shard_size} format={cfg.file_format} v=1"
