"""Kernel routes: chosen by timing on this machine, kept on disk, and equal in value to whisper's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from medusa_whisper.step import cpu, kinds, projection, routes
from medusa_whisper.step.routes import ROUNDS, ROW_COUNTS, WEIGHT_FIRST, WHISPER_ROUTE, RouteTable


@pytest.fixture(autouse=True)
def no_recorded_kinds(request, monkeypatch):
    """These tests time choices as on a CPU kind never recorded (replaying recorded kinds has its own
    tests, which ask for ``recorded``)."""
    if "recorded" not in request.fixturenames:
        monkeypatch.setattr(kinds, "profiles", lambda: {})
        monkeypatch.delenv(kinds.PIN_ENV, raising=False)


@pytest.fixture
def recorded(monkeypatch):
    """Two recorded kinds: one like the running CPU, one unlike it; returns them by name."""
    here = kinds.this_cpu()
    shape = ("linear", 96, 64, "float32")
    named = {
        "like-this": {"kind": "like-this", "cpu": here, "choices": {
            routes._name(shape, 1): {"route": WEIGHT_FIRST, "us": {WEIGHT_FIRST: 1.0, WHISPER_ROUTE: 2.0}},
            "a kernel": {"route": "y", "us": {"x": 2.0, "y": 1.0}},
            "a job": {"route": "b", "us": {"a": 2.0, "b": 1.0}}}},
        "unlike": {"kind": "unlike", "cpu": {"vendor": "elsewhere", "family": -1, "model": -1, "isa": "none"},
                   "choices": {
            routes._name(shape, 1): {"route": WHISPER_ROUTE, "us": {WEIGHT_FIRST: 2.0, WHISPER_ROUTE: 1.0}},
            routes._name(shape, 2): {"route": WEIGHT_FIRST, "us": {WEIGHT_FIRST: 1.0, WHISPER_ROUTE: 2.0}},
            "a job": {"route": "a", "us": {"a": 1.0, "b": 2.0}}}}}
    monkeypatch.setattr(kinds, "profiles", lambda: named)
    monkeypatch.delenv(kinds.PIN_ENV, raising=False)
    return named


def refuse_timing(*args):
    pytest.fail("timed")


def test_an_unmeasured_choice_is_replayed_from_the_nearest_recorded_kind_that_holds_it(recorded, tmp_path):
    assert kinds.ranked() == ["like-this", "unlike"]
    path = tmp_path / "routes.json"
    table = RouteTable(path, timer=refuse_timing)
    shape = ("linear", 96, 64, "float32")
    assert table.choose(shape, 1) == WEIGHT_FIRST  # the kind like this CPU
    assert table.choose(shape, 3) == WEIGHT_FIRST  # only the unlike kind holds 2 rows
    assert table.choose_kernel("a kernel", {"x": refuse_timing, "y": refuse_timing}) == "y"
    assert table.costs("a job", refuse_timing, job=True) == {"a": 2.0, "b": 1.0}
    assert table.choices["a job"]["predicted"] == "like-this" and not path.exists()  # nothing kept on disk
    # a kind's kernel that is not among the candidates here is not replayed: timed
    assert table.choose_kernel("a kernel", {"x": lambda: 1.0, "z": lambda: 2.0}) == "x"
    # where no kind holds a job, its default; a cheap choice is timed
    assert table.costs("another job", refuse_timing, job=True, default=lambda: {"safe": 1.0}) == {"safe": 1.0}
    assert table.costs("a cost", lambda: {"one": 5.0}, default=lambda: {"one": 1.0}) == {"one": 5.0}
    assert json.loads(path.read_text())["choices"].keys() == {"a kernel", "a cost"}


def test_tune_times_what_a_first_run_replayed(recorded, tmp_path):
    table = RouteTable(tmp_path / "routes.json", timer=fake_timer([]))
    assert table.costs("a job", refuse_timing, job=True) == {"a": 2.0, "b": 1.0}
    table.timing = "jobs"
    assert table.costs("a job", lambda: {"a": 1.0, "b": 3.0}, job=True) == {"a": 1.0, "b": 3.0}
    assert table.choose(("linear", 96, 64, "float32"), 1) == WEIGHT_FIRST  # a route is the kind's still ...
    every = RouteTable(tmp_path / "routes.json", timer=fake_timer([]))
    every.timing = "all"
    assert every.choose(("linear", 96, 64, "float32"), 1) == WHISPER_ROUTE  # ... until every choice is timed
    assert RouteTable(tmp_path / "routes.json", timer=refuse_timing).costs("a job", refuse_timing, job=True) \
        == {"a": 1.0, "b": 3.0}  # measured here now: kept for the next process


def test_a_pinned_table_times_nothing_writes_nothing_and_replays_its_kind_first(recorded, tmp_path, monkeypatch):
    monkeypatch.setenv("MEDUSA_WHISPER_CACHE", str(tmp_path))
    monkeypatch.setenv(kinds.PIN_ENV, "unlike")
    monkeypatch.setattr(routes, "time_route", refuse_timing)
    table = routes.table()
    assert table.pinned == "unlike" and table.path is None
    shape = ("linear", 96, 64, "float32")
    assert table.choose(shape, 1) == WHISPER_ROUTE  # the pinned kind's, though another kind is nearer here
    assert table.choose(shape, 16) == WHISPER_ROUTE  # held by no kind: whisper's route, untimed
    assert table.choose_kernel("a kernel", {"x": refuse_timing, "y": refuse_timing}) == "y"  # a nearer kind's
    assert table.choose_kernel("no kind's", {"x": refuse_timing, "y": refuse_timing}) == "x"  # the first
    assert table.costs("a job", refuse_timing, job=True) == {"a": 1.0, "b": 2.0}
    assert table.costs("a cost", refuse_timing, default=lambda: {"one": 1.0}) == {"one": 1.0}
    assert not (tmp_path / "routes").exists()
    monkeypatch.setenv(kinds.PIN_ENV, "no-such-kind")
    with pytest.raises(ValueError, match="no such recorded CPU kind"):
        routes.table()


def test_the_nearest_kind_shares_the_isa_first_then_the_vendor_family_and_model(monkeypatch):
    amx = "avx2 avx512f avx512_vnni avx_vnni avx512_bf16 amx_bf16 amx_int8"
    named = {"epyc-23": {"cpu": {"vendor": "AuthenticAMD", "family": 23, "model": 1, "isa": "avx2"}},
             "epyc-25": {"cpu": {"vendor": "AuthenticAMD", "family": 25, "model": 1, "isa": "avx2"}},
             "xeon-amx": {"cpu": {"vendor": "GenuineIntel", "family": 6, "model": 143, "isa": amx}},
             "xeon-noamx": {"cpu": {"vendor": "GenuineIntel", "family": 6, "model": 207,
                                    "isa": "avx2 avx512f avx512_vnni avx_vnni avx512_bf16"}}}
    monkeypatch.setattr(kinds, "profiles", lambda: named)
    assert kinds.ranked({"vendor": "AuthenticAMD", "family": 25, "model": 17, "isa": "avx2"})[:2] == ["epyc-25", "epyc-23"]
    assert kinds.ranked({"vendor": "GenuineIntel", "family": 6, "model": 207, "isa": amx})[:2] == ["xeon-amx", "xeon-noamx"]
    assert kinds.ranked({"vendor": "GenuineIntel", "family": 6, "model": 85, "isa": "avx2 avx512f"})[0] == "xeon-noamx"
    assert kinds.ranked({"vendor": "AuthenticAMD", "family": 26, "model": 2, "isa": "avx2 avx512f"})[0].startswith("epyc")


def fake_timer(calls):
    """W @ x.T is faster for 2 and 4 rows, x @ W.T otherwise; records what it was asked."""
    def timer(shape, rows, route):
        calls.append((shape, rows, route))
        weight_first_wins = rows in (2, 4)
        return 1.0 if (route == WEIGHT_FIRST) == weight_first_wins else 2.0
    return timer


def test_the_faster_route_is_kept_per_row_count_and_saved(tmp_path):
    calls = []
    path = tmp_path / "routes.json"
    table = RouteTable(path, timer=fake_timer(calls))
    shape = ("linear", 64, 32, "float32")
    assert table.choose(shape, 1) == WHISPER_ROUTE
    assert table.measured == 1 and len(calls) == 2 * ROUNDS * len(ROW_COUNTS)  # every count timed at once
    assert table.choose(shape, 2) == WEIGHT_FIRST
    assert table.choose(shape, 3) == WEIGHT_FIRST  # between two counts: the lower one's route
    assert table.choose(shape, 8) == WHISPER_ROUTE
    assert table.measured == 1 and len(calls) == 2 * ROUNDS * len(ROW_COUNTS)
    saved = json.loads(path.read_text())
    assert saved["machine"]["torch"] == torch.__version__
    assert saved["choices"]["linear 64x32 float32 rows=4"]["route"] == WEIGHT_FIRST

    def refuse(*args):
        raise AssertionError("a saved choice was measured again")
    again = RouteTable(path, timer=refuse)
    assert [again.choose(shape, n) for n in (1, 2, 4, 16)] == [WHISPER_ROUTE, WEIGHT_FIRST, WEIGHT_FIRST,
                                                               WHISPER_ROUTE]
    assert again.measured == 0


def test_a_burst_of_load_during_one_route_does_not_decide(tmp_path):
    """W @ x.T is truly faster (1.0 against 1.2), but the machine is busy (+2.0) during the second
    timing of each row count, which timed once per route is all of W @ x.T's; alternating rounds and
    their fastest one keep the true order."""
    calls = []

    def timer(shape, rows, route):
        calls.append(rows)
        busy = calls.count(rows) == 2
        return (1.0 if route == WEIGHT_FIRST else 1.2) + (2.0 if busy else 0.0)

    table = RouteTable(tmp_path / "routes.json", timer=timer)
    assert all(table.choose(("linear", 64, 32, "float32"), rows) == WEIGHT_FIRST for rows in ROW_COUNTS)


def test_an_unreadable_cache_file_is_measured_again(tmp_path):
    path = tmp_path / "routes.json"
    path.write_text("{not json")
    table = RouteTable(path, timer=fake_timer([]))
    assert table.choose(("projection", 10, 8, "float32"), 4) == WEIGHT_FIRST
    assert json.loads(path.read_text())["choices"]


def test_a_second_process_reuses_the_measured_choices(tmp_path):
    # as on an idle machine (a busy one makes the next process time its choices again: tested below)
    script = ("import torch; from medusa_whisper.step import routes; torch.set_num_threads(2); "
              "routes._preemptions = lambda: 0; routes.streamed_bytes = lambda: 1 << 20; "
              "w = torch.randn(96, 64); r = routes.route_for('linear', w, 1); "
              "print(routes.table().measured, r)")
    env = {**os.environ, "MEDUSA_WHISPER_CACHE": str(tmp_path)}
    env.pop(routes.ROUTES_ENV, None)
    env.pop(kinds.PIN_ENV, None)
    first, second = (subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                    check=True).stdout.split() for _ in range(2))
    assert first[0] == "1" and second[0] == "0"
    assert first[1] == second[1] in routes.ROUTES
    assert len(list((tmp_path / "routes").glob("*.json"))) == 1


def test_the_whisper_setting_measures_nothing(monkeypatch):
    monkeypatch.setenv(routes.ROUTES_ENV, "whisper")
    monkeypatch.setattr(routes, "time_route", lambda *a: pytest.fail("measured"))
    assert routes.route_for("linear", torch.randn(40, 24), 2) == WHISPER_ROUTE


@pytest.mark.parametrize("route", routes.ROUTES)
@pytest.mark.parametrize("rows", [1, 3, 16, 40])
def test_either_route_gives_whispers_values(monkeypatch, route, rows):
    monkeypatch.setattr(cpu, "route_for", lambda kind, weight, n: route)
    torch.manual_seed(rows)
    layer = nn.Linear(48, 80)
    x = torch.randn(1, rows, 48)
    torch.testing.assert_close(cpu.linear(layer, x), layer(x), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(projection, "route_for", lambda kind, weight, n: route)
    embedding = nn.Embedding(120, 48)
    vocabulary = projection.FloatProjection(embedding)
    weight = embedding.weight.detach()
    torch.testing.assert_close(vocabulary(x), x @ weight.T, rtol=1e-5, atol=1e-5)
    some = torch.tensor([3, 7, 50, 119])
    torch.testing.assert_close(vocabulary.select(some)(x), F.linear(x, weight[some]), rtol=1e-5, atol=1e-5)


def disturbed_timer(calls, busy_measurements):
    """Honest times (more rows, more time), except that while the first ``busy_measurements``
    measurements of a shape last, 4 rows take 8 ms against 0.6 ms at 8 rows."""
    per_measurement = 2 * ROUNDS * len(ROW_COUNTS)

    def timer(shape, rows, route):
        calls.append(rows)
        busy = (len(calls) - 1) // per_measurement < busy_measurements
        return 8000.0 if busy and rows == 4 else 100.0 * rows + (0 if route == WEIGHT_FIRST else 10)
    return timer


def test_a_disturbed_measurement_is_timed_again_at_once(tmp_path):
    calls = []
    table = RouteTable(tmp_path / "routes.json", timer=disturbed_timer(calls, busy_measurements=1))
    shape = ("linear", 1536, 384, "float32")
    assert table.choose(shape, 4) == WEIGHT_FIRST
    assert len(calls) == 2 * 2 * ROUNDS * len(ROW_COUNTS)  # measured twice in this process
    entry = json.loads((tmp_path / "routes.json").read_text())["choices"]["linear 1536x384 float32 rows=4"]
    assert "suspect" not in entry and entry["attempts"] == 2 and entry["us"][WEIGHT_FIRST] == 400.0


def test_a_choice_that_stays_disturbed_is_timed_again_by_later_processes_up_to_a_limit(tmp_path):
    path = tmp_path / "routes.json"
    shape = ("linear", 1536, 384, "float32")
    calls = []
    RouteTable(path, timer=disturbed_timer(calls, busy_measurements=2)).choose(shape, 4)
    entry = json.loads(path.read_text())["choices"]["linear 1536x384 float32 rows=4"]
    assert entry["suspect"] and entry["attempts"] == 2
    later = []  # the next process, on an idle machine: once, and then no more
    table = RouteTable(path, timer=disturbed_timer(later, busy_measurements=0))
    assert table.choose(shape, 4) == WEIGHT_FIRST and table.choose(shape, 8) == WEIGHT_FIRST
    assert len(later) == 2 * ROUNDS * len(ROW_COUNTS)
    entry = json.loads(path.read_text())["choices"]["linear 1536x384 float32 rows=4"]
    assert "suspect" not in entry and entry["attempts"] == 3
    RouteTable(path, timer=disturbed_timer([], busy_measurements=9)).choose(shape, 4)  # clean: not again

    # a machine that is always busy: measured until MAX_ATTEMPTS, then the choice is kept as it is
    busy = tmp_path / "busy.json"
    for _ in range(3):
        RouteTable(busy, timer=disturbed_timer([], busy_measurements=9)).choose(shape, 4)
    entry = json.loads(busy.read_text())["choices"]["linear 1536x384 float32 rows=4"]
    assert entry["suspect"] and entry["attempts"] >= routes.MAX_ATTEMPTS

    def refuse(*args):
        raise AssertionError("measured again")
    RouteTable(busy, timer=refuse).choose(shape, 4)
    RouteTable(path, timer=refuse).choose(shape, 4)


def busy_machine(monkeypatch, busy: bool) -> None:
    """Make every timing look preempted 100 times (another job on this process's cores), or never."""
    counter = iter(range(0, 10 ** 9, 100 if busy else 0) if busy else iter(lambda: 0, 1))
    monkeypatch.setattr(routes, "_preemptions", lambda: next(counter))


def test_a_kernel_choice_timed_while_the_machine_was_busy_is_timed_again_by_the_next_process(tmp_path, monkeypatch):
    path = tmp_path / "routes.json"
    name = "int8 projection 51865x512"
    timings = []

    def candidates(fast: str):
        def timer(kernel):
            def run():
                timings.append(kernel)
                return 1.0 if kernel == fast else 2.0
            return run
        return {k: timer(k) for k in ("rowwise", "weight_only")}

    busy_machine(monkeypatch, True)  # busy: the slower kernel looked faster
    assert RouteTable(path).choose_kernel(name, candidates("weight_only")) == "weight_only"
    entry = json.loads(path.read_text())["choices"][name]
    assert entry["suspect"] and entry["attempts"] == 1
    busy_machine(monkeypatch, False)
    table = RouteTable(path)  # the next process, idle: timed again once, and kept
    assert table.choose_kernel(name, candidates("rowwise")) == "rowwise"
    assert table.choose_kernel(name, candidates("weight_only")) == "rowwise"  # once per process
    entry = json.loads(path.read_text())["choices"][name]
    assert "suspect" not in entry and entry["attempts"] == 2 and timings.count("rowwise") == 2
    assert RouteTable(path).choose_kernel(name, candidates("weight_only")) == "rowwise"  # clean: not again
    assert len(timings) == 4

    # costs() alike: a busy measurement is marked and measured again by the next process
    busy_machine(monkeypatch, True)
    assert RouteTable(path).costs("batch sizes", lambda: {"1": 9.0, "8": 3.0}) == {"1": 9.0, "8": 3.0}
    busy_machine(monkeypatch, False)
    assert RouteTable(path).costs("batch sizes", lambda: {"1": 9.0, "8": 1.0}) == {"1": 9.0, "8": 1.0}
    assert RouteTable(path).costs("batch sizes", lambda: {"1": 0.0, "8": 0.0}) == {"1": 9.0, "8": 1.0}


def test_a_kernel_choice_is_timed_again_when_its_candidates_change(tmp_path, monkeypatch):
    """A kernel added to a choice (the int8 projection's "dynamic") is timed against the kept one by
    the next process, and a choice timed with it is kept while the candidates stay the same."""
    path = tmp_path / "routes.json"
    name = "int8 projection 51865x512"
    timings = []
    busy_machine(monkeypatch, False)

    def candidates(micros):
        def timer(kernel):
            def run():
                timings.append(kernel)
                return micros[kernel]
            return run
        return {k: timer(k) for k in micros}

    assert RouteTable(path).choose_kernel(name, candidates({"rowwise": 2.0, "weight_only": 1.0})) == "weight_only"
    added = {"rowwise": 2.0, "dynamic": 0.5}  # weight_only no longer offered, dynamic new
    assert RouteTable(path).choose_kernel(name, candidates(added)) == "dynamic"
    assert RouteTable(path).choose_kernel(name, candidates({"rowwise": 0.1, "dynamic": 9.0})) == "dynamic"  # kept
    assert timings == ["rowwise", "weight_only", "rowwise", "dynamic"]
    assert set(json.loads(path.read_text())["choices"][name]["us"]) == {"rowwise", "dynamic"}


def test_row_routes_timed_while_the_machine_was_busy_are_timed_again_at_once(tmp_path, monkeypatch):
    calls = []
    busy_machine(monkeypatch, True)
    table = RouteTable(tmp_path / "routes.json", timer=fake_timer(calls))
    table.choose(("linear", 512, 512, "float32"), 1)
    assert len(calls) == 2 * 2 * ROUNDS * len(ROW_COUNTS)  # plausible times, but busy: measured twice
    entry = json.loads((tmp_path / "routes.json").read_text())["choices"]["linear 512x512 float32 rows=1"]
    assert entry["suspect"] and entry["attempts"] == 2


def test_choices_timed_with_the_kernels_capped_are_kept_apart(monkeypatch):
    """ATEN_CPU_CAPABILITY and ONEDNN_MAX_CPU_ISA let one CPU time what a smaller one runs: those
    timings get their own table, and the real machine's choices are not overwritten by them."""
    for name in routes.DISPATCH_ENV:
        monkeypatch.delenv(name, raising=False)
    plain = routes.machine_id()
    assert "dispatch" not in plain and routes.dispatch_caps() == ""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = routes.machine_id()
    assert capped["dispatch"] == "ONEDNN_MAX_CPU_ISA=AVX2"
    capped_table = routes.table()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    assert routes.machine_id() == plain and routes.table().path != capped_table.path


def test_kernels_capped_below_bfloat16_count_as_a_cpu_without_it(monkeypatch):
    from medusa_whisper.step import compute
    for name in routes.DISPATCH_ENV:
        monkeypatch.delenv(name, raising=False)
    assert not compute._dispatch_capped_below_bfloat16()
    for name, value in (("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_VNNI")):
        monkeypatch.setenv(name, value)
        assert compute._dispatch_capped_below_bfloat16()
        compute.cpu_has_bfloat16.cache_clear()
        assert not compute.cpu_has_bfloat16()
        monkeypatch.delenv(name)
        compute.cpu_has_bfloat16.cache_clear()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_AMX")
    assert not compute._dispatch_capped_below_bfloat16()
    compute.cpu_has_bfloat16.cache_clear()


def test_measuring_leaves_the_callers_random_state_alone(tmp_path):
    """Kernels are timed on random inputs on first use, in the middle of a run: a seeded caller
    (whisper's sampled fallback) must draw next what it would have drawn without the measurement."""
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    # a timer that draws, as the real one does (its random weights and rows), without its seconds
    table = RouteTable(tmp_path / "routes.json", timer=lambda *args: float(torch.rand(1)) + 1.0)
    table.costs("a measurement", lambda: {"a": float(torch.rand(1000).sum()), "b": 1.0})
    table.choose_kernel("a kernel", {"x": lambda: float(torch.randn(1000).sum()), "y": lambda: 1.0})
    table.choose(("linear", 48, 32, "float32"), 4)  # the routes of a shape: timed on random weights
    assert torch.equal(torch.rand(4), expected)


def test_the_int8_kernel_choices_made_on_first_use_draw_nothing_from_the_callers_random_state(measure_afresh):
    """The real timers, not stand-ins: the int8 projection's kernel and the many-rows kernel and its
    crossing, measured on first use in the middle of a run, draw their random weights and rows from
    the measurement's own random state (an int8 run's sampled fallback windows shifted otherwise, so
    a speculative run sampled other text than plain decoding from the same seed)."""
    from medusa_whisper.step import compute

    layer = projection.Int8Projection.from_weight(torch.randn(300, 64))
    measure_afresh()
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    layer.choose_kernel()
    compute.many_rows_kernel(96, 64)
    compute.many_rows_from(96, 64)
    assert routes.table().measured >= 2, "each choice was timed here, on first use"
    assert torch.equal(torch.rand(4), expected)
