"""The Serve generator's request planner on the batch job's building blocks (tiny model, no Ray)."""

import pytest

from ctrlgen.config import GenerationConfig
from ctrlgen.errors import CtrlgenError
from ctrlgen.fictional import FictionalCodes
from ctrlgen.generation.icl import select_pool
from ctrlgen.generation.synthesis import SynthesisPlanner
from ctrlgen.metrics.leakage import leaked_values
from ctrlgen.models import tiny_llama

ROWS = [{"doc_id": f"d{i}", "text": f"Seen by Dr. Name{i} at Place{i}.", "control_code": f"PERSON: Name{i}\nLOC: Place{i}"}
        for i in range(12)]  # fmt: skip


@pytest.fixture(scope="module")
def planner():
    _, tok = tiny_llama()
    real = [v for i in range(12) for v in (f"Name{i}", f"Place{i}")]
    return SynthesisPlanner(ROWS, tok, GenerationConfig(), FictionalCodes(0, real))


def test_plans_are_reproducible_per_output_and_differ_between_outputs(planner):
    a, b = planner.plan("icl_blocking", n=3, seed=9), planner.plan("icl_blocking", n=3, seed=9)
    assert a == b
    assert len({p.work.request.seed for p in a}) == 3
    assert planner.plan("icl_blocking", n=1, seed=9)[0] == a[0]  # output 0 does not depend on n


def test_contexts_never_include_the_template_and_fictional_codes_avoid_real_values(planner):
    for p in planner.plan("icl_blocking", n=8, seed=1):
        assert len(p.context_ids) == 3 and p.template_id not in p.context_ids
        ctx_values = [v for c in p.context_ids for v in (f"Name{c[1:]}", f"Place{c[1:]}")]
        assert sorted(p.work.known) == sorted(ctx_values)
        assert p.work.request.banned  # icl_blocking bans the contexts' values
        assert not leaked_values(p.fictional_code, [v for r in ROWS for v in r["control_code"].split(": ")[1:]])


def test_a_given_code_is_used_as_sent_and_modes_shape_the_request(planner):
    icl = planner.plan("icl", n=2, seed=3, control_code="PERSON: Ann Vale", max_new_tokens=5)
    assert all(p.fictional_code == "PERSON: Ann Vale" and not p.template_id for p in icl)
    assert all(p.work.request.max_new_tokens == 5 and not p.work.request.banned for p in icl)
    prefix = planner.plan("prefix", seed=3, control_code="PERSON: Ann Vale", finetune_values=["x"])[0]
    assert prefix.context_ids == () and sorted(prefix.work.known) == ["x"]
    with pytest.raises(CtrlgenError):
        planner.plan("icl", control_code="nothing useful")


def test_streamed_pool_selection_equals_the_top_k_of_everything():
    batches = [ROWS[i : i + 5] for i in range(0, 12, 5)]
    assert select_pool(batches, 4, seed=0) == select_pool([ROWS], 4, seed=0)
    assert len(select_pool([ROWS], 20, seed=0)) == 12
