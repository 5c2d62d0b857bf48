"""Names and places spread over a patient's notes (ctrlgen.extract.presidio.propagate_across_notes)."""

from ctrlgen.extract.presidio import propagate_across_notes
from ctrlgen.schema import Document, Entity


def _doc(doc_id: str, text: str, patient: str | None, *found: tuple[str, str]) -> Document:
    ents = [Entity(text.index(v), text.index(v) + len(v), v, cat, "DIRECT", "ner", "") for v, cat in found]
    return Document(doc_id, text, {"patient": patient} if patient else {}, ents)


def test_a_name_found_in_one_note_of_a_patient_is_marked_in_the_patients_other_notes() -> None:
    docs = [
        _doc("a1", "Seen by Dr. Quartermain at Mercyvale today.", "p1", ("Quartermain", "PERSON"), ("Mercyvale", "LOC")),
        _doc("a2", "QUARTERMAIN called; transfer to mercyvale and home.", "p1"),
        _doc("b1", "Quartermain is another patient's word here.", "p2"),
        _doc("c1", "Quartermain without a patient.", None),
    ]
    out = propagate_across_notes(docs, common=frozenset({"home"}))
    assert [d.doc_id for d in out] == ["a1", "a2", "b1", "c1"] and out[0].entities == docs[0].entities
    a2 = out[1]
    assert [(e.text, e.category) for e in a2.entities] == [("QUARTERMAIN", "PERSON"), ("mercyvale", "LOC")]
    assert all(a2.text[e.start : e.end] == e.text for e in a2.entities)
    assert out[2].entities == [] and out[3].entities == []  # another patient's notes, and a note without one
    assert docs[1].entities == []  # pure: the input is left as it was


def test_common_words_short_words_and_covered_places_do_not_spread() -> None:
    docs = [
        _doc("a1", "Ann Lee and the Heart Center.", "p1", ("Ann Lee", "PERSON"), ("Heart Center", "LOC")),
        _doc("a2", "Lee heart center; Ann.", "p1", ("Lee heart", "PERSON")),
    ]
    out = propagate_across_notes(docs, common=frozenset({"heart", "center"}))
    # "Ann" and "Lee" have 3 letters and spread; "heart"/"center" are common words; "Lee" is covered already
    assert [(e.text, e.category) for e in out[1].entities] == [("Lee heart", "PERSON"), ("Ann", "PERSON")]
