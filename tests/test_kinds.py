"""Every CPU kind met, replayed: medusa_whisper/kinds/*.json (tools.bench kind-profile) hold each kind's
job times and what measured fastest there; the package's choice rules, given those times, must choose it."""

import json
import pytest

from medusa_whisper import tuning
from medusa_whisper.decoding.batches import choose_batch_size
from medusa_whisper.step import encoder_form, kinds

KINDS = sorted(kinds.KINDS_DIR.glob("*.json"))


def rule(decision: str):
    """The package's choice for one decision, over measured costs (candidate -> time)."""
    return {
        "int8 encoder form": encoder_form.choose,
        "compute type": tuning.choose,
        "batch width": lambda costs: choose_batch_size({int(k): v for k, v in costs.items()}),
        "float32 routes": tuning.choose_routes,
        # plain decoding is the shortest name of those timed (tiny.en beside tiny.en-ctc, base+tiny.en)
        "proposer": lambda costs: tuning.choose_proposer(min(tuning.costs_by_proposer(costs), key=len), costs),
    }[decision]


def test_there_is_a_profile_of_every_kind_met():
    kinds = {json.loads(path.read_text())["kind"] for path in KINDS}
    assert {"xeon-avx512bf16-noamx", "xeon-amx", "epyc-avx2-zen3"} <= kinds and len(kinds) >= 4


def key(decision: str, choice) -> str:
    """A choice's key in a kind's job times."""
    return f"encoder {choice}" if decision == "int8 encoder form" else str(choice)


# the real jobs' times of two candidates within this much of each other are a tie (the machines drift by more)
TIED = 1.05


@pytest.mark.parametrize("path", KINDS, ids=[p.stem for p in KINDS])
def test_the_rules_given_a_kinds_job_times_choose_what_measured_fastest_there(path):
    """Or, within a tie, what the rule prefers there (the more exact type or form, the narrower batch)."""
    profile = json.loads(path.read_text())
    assert profile["cpu"]["isa"] and profile["threads"] and profile["fastest"]
    for decision, fastest in profile["fastest"].items():
        jobs = {str(k): v for k, v in profile["jobs"][decision].items()}
        chosen = rule(decision)(jobs)
        assert chosen == fastest or jobs[key(decision, chosen)] <= TIED * jobs[key(decision, fastest)], \
            (decision, chosen, jobs)


@pytest.mark.parametrize("path", KINDS, ids=[p.stem for p in KINDS])
def test_the_calibrations_own_choice_there_was_no_slower_on_the_real_jobs(path):
    """Where a kind's file holds what the package's calibration timed there (its job, not the
    benches'), its choice is the rule's, and on the real jobs it was what measured fastest, or
    within TIED of it."""
    profile = json.loads(path.read_text())
    for decision, measured in profile.get("calibration", {}).items():
        chosen = rule(decision)(measured["us"])
        assert chosen == measured["chosen"]
        jobs = {str(k): v for k, v in profile["jobs"].get(decision, {}).items()}
        if key(decision, chosen) in jobs:
            assert jobs[key(decision, chosen)] <= TIED * min(jobs.values()), (decision, chosen, jobs)
        elif decision in profile["fastest"]:
            assert chosen == profile["fastest"][decision], decision


def test_the_rules_are_not_argmin_alone():
    """Replayed on a near tie, each rule keeps the more exact or the narrower choice."""
    assert encoder_form.choose({"encoder float32": 100.0, "encoder int8 rows": 97.0}) == "float32"
    assert tuning.choose({"float32": 100.0, "int8": 97.0}) == "float32"
    assert choose_batch_size({1: 100.0, 4: 95.0, 16: 60.0}) == 16
    assert choose_batch_size({1: 100.0, 16: 95.0}) == 1  # under 10 % saved: one at a time
    assert tuning.choose_routes({"measured": 97.0, "whisper": 100.0}) == "whisper"
