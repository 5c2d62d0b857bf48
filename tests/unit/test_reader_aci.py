import csv

from ctrlgen.config import AciCorpusConfig
from ctrlgen.corpora import load_corpus
from ctrlgen.corpora.aci import known_value_entities


def test_reads_train_and_valid_with_known_names_and_ages(shared):
    for split, n in (("train", 67), ("valid", 20)):
        docs, bad, _ = load_corpus(
            AciCorpusConfig(path=str(shared / f"aci-bench/{split}.csv"), identifiers="direct+quasi")
        )
        assert (len(docs), len(bad)) == (n, 0)
        meta = {r["encounter_id"]: r for r in csv.DictReader(open(shared / f"aci-bench/{split}_metadata.csv"))}
        for d in docs:
            m = meta[d.metadata["encounter_id"]]
            for e in d.entities:
                assert d.text[e.start : e.end] == e.text
                if e.category == "PERSON":
                    known = (m["patient_firstname"], m["patient_familyname"], m["doctor_name"])
                    assert e.text.lower() in [k.strip().lower() for k in known]
                else:
                    assert e.text == m["patient_age"]


def test_age_forms_and_word_boundaries():
    text = "Ann Lee is a 50-year-old; aged 50. Anne and 150 mg, 50 mg."
    ents = known_value_entities(text, [("Ann", "first")], "50")
    assert [(e.text, e.start) for e in ents] == [("Ann", 0), ("50", 13), ("50", 31)]


def test_encounter_without_metadata_is_quarantined(tmp_path):
    (tmp_path / "n.csv").write_text("dataset,encounter_id,dialogue,note\nx,E1,hi,Note for Bo.\nx,E2,hi,Other.\n")
    (tmp_path / "n_metadata.csv").write_text(
        "dataset,encounter_id,patient_firstname,patient_familyname,patient_age\nx,E1,Bo,Li,40\n"
    )
    docs, bad, report = load_corpus(AciCorpusConfig(path=str(tmp_path / "n.csv")))
    assert [d.doc_id for d in docs] == ["x-E1"] and docs[0].entities[0].text == "Bo"
    assert "no metadata row" in bad[0].reason and report.rows_in == 2
