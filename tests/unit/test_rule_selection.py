"""In-fold selection of the extraction rules (ctrlgen.extract.rules) and its place in the cross-validation."""

import json
from pathlib import Path

import pytest

from ctrlgen.config import ExtractionConfig, NerTrainingConfig, PhysionetCorpusConfig, RuleTuningConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.extract.rules import Analysed, analysis_under, candidate_changes, f_beta, select_rules
from ctrlgen.schema import Document, Entity

ROOT = Path(__file__).resolve().parents[2]
TOOL = (ROOT / ".." / "shared" / "tools" / "physionet-deid").resolve()
pytestmark = pytest.mark.skipif(
    not TOOL.is_dir(), reason=f"needs PhysioNet's deid tool (its name lists) at {TOOL}, beside the repository"
)


def _notes(shared: Path, n: int | None = None) -> list[Document]:
    cfg = PhysionetCorpusConfig(path=str(shared / "physionet-deid"), identifiers="direct+quasi", limit=n)
    return load_corpus(cfg)[0]


def test_f_beta_weighs_recall_and_candidates_are_single_changes() -> None:
    assert f_beta(0.8, 1.0, 2.0) > f_beta(1.0, 0.8, 2.0)
    assert f_beta(0.5, 0.5, 1.0) == pytest.approx(0.5)
    assert f_beta(float("nan"), 0.0, 2.0) == 0.0  # nothing predicted
    cfg = ExtractionConfig(recognizers=["SpacyRecognizer", "DictionaryRecognizer", "AgeRecognizer"],
                           clinical_number_veto=True, propagate_mentions=False, expand_initials=True,
                           score_threshold=0.5)  # fmt: skip
    labels = [label for label, _ in candidate_changes(cfg, [0.4, 0.5, 0.6])]
    assert labels == ["-DictionaryRecognizer", "-AgeRecognizer", "-clinical_number_veto", "-expand_initials",
                      "threshold 0.4", "threshold 0.6"]  # fmt: skip
    for label, c in candidate_changes(cfg, [0.4]):  # each differs from cfg in exactly one field
        diff = {k for k, v in c.model_dump().items() if v != cfg.model_dump()[k]}
        assert len(diff) == 1, label
        assert "SpacyRecognizer" in c.recognizers


def test_selection_drops_a_rule_that_only_adds_false_positives_and_keeps_an_idle_one() -> None:
    from presidio_analyzer import RecognizerResult

    def finish(text: str, results: list, cfg: ExtractionConfig) -> list[Entity]:
        return [Entity(r.start, r.end, text[r.start : r.end], r.entity_type, "DIRECT", "test") for r in results]

    notes = []
    for i in range(6):
        text = f"Alice went to Paris {i}"
        gold = Document(f"d{i}", text, entities=[Entity(0, 5, "Alice", "PERSON", "DIRECT", "gold")])
        results = [("SpacyRecognizer", RecognizerResult("PERSON", 0, 5, 0.85)),
                   ("NoisyRecognizer", RecognizerResult("LOC", 14, 19, 0.6))]  # fmt: skip
        if i == 0:  # the ordinary rule finds one name the NER missed... in a note where the NER found it too
            results.append(("UsefulRecognizer", RecognizerResult("PERSON", 0, 5, 0.6)))
        notes.append(Analysed(gold, results))
    cfg = ExtractionConfig(recognizers=["SpacyRecognizer", "NoisyRecognizer", "UsefulRecognizer", "IdleRecognizer"],
                           clinical_number_veto=False, propagate_mentions=False, expand_initials=False)  # fmt: skip
    sel = select_rules(notes, cfg, finish, beta=2.0, thresholds=[0.5, 0.7])
    assert sel.steps == ["-NoisyRecognizer"]  # threshold 0.7 would do the same; the rule goes first
    assert sel.cfg.recognizers == ["SpacyRecognizer", "UsefulRecognizer", "IdleRecognizer"]
    assert sel.start[1] == pytest.approx(0.5) and sel.end == pytest.approx((1.0, 1.0, 1.0))
    assert sel.tuning_notes == 6 and sel.evaluated > len(candidate_changes(cfg, [0.5, 0.7]))
    assert "NoisyRecognizer" in sel.text() and "Alice" not in sel.text()


def test_scores_from_one_analysis_equal_an_engine_built_with_each_configuration(shared) -> None:
    """analysis_under + finish on the full engine's raw results == the engine of that configuration."""
    from ctrlgen.extract.presidio import PresidioExtractor

    texts = [d.text for d in _notes(shared, 40)]
    rules = ["SpacyRecognizer", "MimicPlaceholderRecognizer", "DictionaryRecognizer", "NameFieldRecognizer",
             "ClinicalDateRecognizer", "ClinicalPhoneRecognizer", "ClinicalFacilityRecognizer", "AgeRecognizer"]  # fmt: skip
    full = ExtractionConfig(setting="unknown", name_lists=str(TOOL / "lists"), common_words=str(TOOL / "dict"),
                            recognizers=rules,
                            clinical_number_veto=True, propagate_mentions=True, expand_initials=True)  # fmt: skip
    engine = PresidioExtractor(full, identifiers="direct+quasi")
    raw = engine.recognizer_results(texts)
    rebuilt = [engine.finish(t, analysis_under(r, full), full) for t, r in zip(texts, raw, strict=True)]
    assert engine.extract_texts(texts) == rebuilt
    without = {name: [r for r in full.recognizers if r != name] for name in full.recognizers}
    variants = [
        full.model_copy(update={"recognizers": without["DictionaryRecognizer"]}),
        full.model_copy(update={"score_threshold": 0.65, "propagate_mentions": False}),
        full.model_copy(
            update={
                "recognizers": without["ClinicalDateRecognizer"],
                "clinical_number_veto": False,
                "expand_initials": False,
            }
        ),
    ]
    found_any = False
    for cfg in variants:
        own = PresidioExtractor(cfg, identifiers="direct+quasi").extract_texts(texts)
        assert own == [engine.finish(t, analysis_under(r, cfg), cfg) for t, r in zip(texts, raw, strict=True)]
        found_any = found_any or own != engine.extract_texts(texts)
    assert found_any  # the variants find something else: the comparison is not vacuous


def test_cross_validation_with_rule_tuning_chooses_rules_without_the_held_out_patients(tmp_path, shared) -> None:
    from ctrlgen.extract.crossval import cross_validate
    from ctrlgen.extract.ner import META_FILE

    by_patient: dict[str, list[Document]] = {}
    for d in _notes(shared):
        by_patient.setdefault(str(d.metadata["patient"]), []).append(d)
    docs = [d for p in sorted(by_patient)[:4] for d in by_patient[p][:3]]  # 3 notes of each of 4 patients
    ex = ExtractionConfig(setting="unknown", name_lists=str(TOOL / "lists"), common_words=str(TOOL / "dict"),
                          propagate_mentions=True,
                          ner_training=NerTrainingConfig(epochs=1, folds=2, workers=1, width=32, depth=1),
                          rule_tuning=RuleTuningConfig(enabled=True, inner_folds=2, thresholds=[0.5, 0.7]))  # fmt: skip
    cv = cross_validate(docs, ex, tmp_path)
    assert len(cv.rules) == 2 and [d.doc_id for d in cv.predicted] == [d.doc_id for d in docs]
    models = sorted(tmp_path.iterdir())
    assert len(models) == 2 + 2 * 2  # the outer folds' NERs and two inner NERs for each
    for i, fold in enumerate(cv.folds):
        inner = [m for m in models if f"fold{i + 1}of2-inner" in m.name]
        assert len(inner) == 2
        seen: set[str] = set()
        for m in inner:
            meta = json.loads((m / META_FILE).read_text())["trained_on"]
            assert not set(meta["held_out_patients"]) & set(fold)  # the inner folds split the training patients
            seen |= set(meta["held_out_patients"])
        assert seen == {p for f in cv.folds if f is not fold for p in f}
        sel = cv.rules[i]
        assert sel.tuning_notes == sum(len(by_patient[p][:3]) for p in seen)  # the training folds' notes only
        assert "SpacyRecognizer" in sel.cfg.recognizers
    # the report's table, and the all-notes choice for the deployed engine (each note scored by its outer model)
    from ctrlgen.extract.crossval import choose_rules
    from ctrlgen.extract.report import _rules_section

    deployed = choose_rules(list(zip(cv.models, cv.per_fold, strict=True)), ex, "direct+quasi", "all notes")
    assert deployed.tuning_notes == len(docs)
    md = _rules_section(cv, ex, deployed)
    rows = [r for r in md.splitlines() if r.startswith("| ") and not r.startswith("| fold")]
    assert [r.split(" | ")[0] for r in rows] == ["| 1", "| 2"]
    assert deployed.text() in md
