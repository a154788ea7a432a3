"""Choices timed on a real job (tuning.py, step/encoder_form.py): the int8 encoder's form, the compute
type ``auto`` takes, ``medusa-whisper tune``; each measured once per machine and kept, the choice
rules over measured costs, and converted models that follow the choice."""

import json

import pytest
import torch
from whisper.model import ModelDimensions

import medusa_whisper
from medusa_whisper import MedusaConfig, tuning
from medusa_whisper.audio import timing_clip
from medusa_whisper.cli import main
from medusa_whisper.step import compute, encoder_form
from medusa_whisper.step.routes import JOB_ROUNDS, RouteTable

from helpers import random_model

SMALL = ModelDimensions(n_mels=80, n_audio_ctx=1500, n_audio_state=64, n_audio_head=2, n_audio_layer=2,
                        n_vocab=51864, n_text_ctx=448, n_text_state=64, n_text_head=2, n_text_layer=2)


@pytest.fixture
def timing(unpinned, monkeypatch):
    """This machine's table, as ``medusa-whisper tune`` uses it: a job not measured here is timed
    (a route on weights streamed from 1 MB, not the decoder's hundreds, where one is timed)."""
    from medusa_whisper.step import routes

    monkeypatch.setattr(routes, "streamed_bytes", lambda: 1 << 20)
    table = routes.table()
    table.timing = "jobs"
    return table


# --- the rules over measured costs ------------------------------------------------------------------


def test_the_encoder_form_is_the_fastest_or_the_more_exact_within_a_tie():
    assert encoder_form.choose({"encoder float32": 1.30e6, "encoder int8 rows": 1.10e6}) == "int8 rows"
    # int8 rows 2 % faster: not worth its error, float32 kept
    assert encoder_form.choose({"encoder float32": 1.30e6, "encoder int8 rows": 1.275e6}) == "float32"
    assert encoder_form.choose({"encoder float32": 389e3, "encoder bfloat16": 582e3, "product int8 rows": 1.0}) \
        == "float32"
    assert encoder_form.choose({"encoder float32": 381e3, "encoder bfloat16": 157e3, "encoder int8 rows": 150e3}) \
        == "bfloat16"


def test_the_compute_type_is_the_fastest_or_the_more_exact_within_a_tie():
    assert tuning.choose({"float32": 21.59, "int8": 24.11}) == "float32"
    assert tuning.choose({"float32": 3.1, "int8": 2.2, "bfloat16": 5.0}) == "int8"
    assert tuning.choose({"float32": 2.25, "int8": 2.2}) == "float32"  # within 5 %: openai-whisper's own numbers
    assert tuning.choose({"float32": 2.0, "float16": 1.0, "int8_float16": 0.97}) == "float16"


# --- the int8 encoder's form ----------------------------------------------------------------------


def test_the_encoder_form_is_predicted_until_tuned_then_timed_once_on_the_timing_clip(unpinned, monkeypatch, capsys):
    from medusa_whisper.step import routes

    with monkeypatch.context() as patched:
        patched.setattr(encoder_form, "measure", lambda *a, **k: pytest.fail("timed before tune"))
        assert compute.int8_encoder_form(SMALL) == "float32"  # no recorded kind holds this shape: the exact form
    routes.table().timing = "jobs"
    mels = []
    real_mel = timing_clip.window_mel
    monkeypatch.setattr(timing_clip, "window_mel", lambda n_mels, length=30.0: mels.append(n_mels) or real_mel(n_mels))
    form = compute.int8_encoder_form(SMALL)
    assert form in encoder_form.FORMS and mels == [SMALL.n_mels]
    saved = json.loads(next((unpinned / "routes").glob("*.json")).read_text())["choices"][encoder_form.name(SMALL)]
    assert encoder_form.choose(saved["us"]) == form
    assert {f"product {f}" for f in encoder_form.FORMS} <= set(saved["us"])  # every form's product shortlists
    timed_whole = [k for k in saved["us"] if k.startswith("encoder ")]
    assert sorted(timed_whole) == sorted(f"encoder {f}" for f in encoder_form.shortlisted(saved["us"]))
    said = capsys.readouterr().err
    assert "timing the int8 encoder" in said and f"-> {form}" in said  # what is timed, how long, the choice
    monkeypatch.setattr(encoder_form, "measure", lambda *a, **k: pytest.fail("timed again"))
    assert compute.int8_encoder_form(SMALL) == form


@pytest.mark.parametrize("form", encoder_form.FORMS)
def test_each_form_encodes_close_to_float32_and_the_decoder_stays_int8(monkeypatch, form):
    from medusa_whisper.step.compute import HalfLinear, Int8Linear

    monkeypatch.setattr(compute, "int8_encoder_form", lambda dims: form)
    reference = random_model(MedusaConfig(num_heads=1))
    model = compute.apply_compute_type(random_model(MedusaConfig(num_heads=1)), "int8")
    assert model.encoder_form == form
    kind = {"float32": torch.nn.Linear, "bfloat16": HalfLinear, "int8 rows": Int8Linear}[form]
    linears = [m for m in model.encoder.modules() if hasattr(m, "in_features")]
    assert linears and all(isinstance(m, kind) for m in linears)
    assert all(isinstance(m, Int8Linear) for m in model.decoder.modules() if hasattr(m, "in_features")
               and not isinstance(m, torch.nn.Embedding))
    mel = timing_clip.window_mel(model.dims.n_mels)[None]
    with torch.inference_mode():
        ours, exact = model.encoder(mel), reference.encoder(mel)
    error = ((ours - exact).norm() / exact.norm()).item()
    assert error < {"float32": 1e-6, "bfloat16": 0.05, "int8 rows": 0.25}[form], error
    assert (error == 0.0) == (form == "float32")


def test_a_cached_conversion_made_with_another_encoder_form_is_converted_again(monkeypatch, tmp_path):
    from medusa_whisper.checkpoints import weights

    monkeypatch.setenv("MEDUSA_WHISPER_CACHE", str(tmp_path))
    monkeypatch.setattr(compute, "int8_encoder_form", lambda dims: "int8 rows")
    first = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    assert first.encoder_form == "int8 rows"
    (cached,) = (tmp_path / "compute").glob("int8-*.safetensors")
    written = cached.stat().st_mtime_ns
    reads = []
    real_load = weights.load_checkpoint
    monkeypatch.setattr(weights, "load_checkpoint", lambda path: reads.append(path) or real_load(path))
    assert medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8").encoder_form == "int8 rows"
    assert not reads  # the same form: read from the cache
    monkeypatch.setattr(compute, "int8_encoder_form", lambda dims: "float32")
    again = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    assert again.encoder_form == "float32" and reads  # converted again from the checkpoint
    assert cached.stat().st_mtime_ns != written  # and the cache holds the new form
    assert not any(isinstance(m, compute.Int8Linear) for m in again.encoder.modules())


# --- the compute type: auto -----------------------------------------------------------------------


def _small_at(compute_type: str):
    """A small random model at a compute type, for a job timed on it."""
    model = random_model(MedusaConfig(num_heads=1), dims=SMALL)
    return model if compute_type == "float32" else compute.apply_compute_type(model, compute_type)


def test_auto_times_each_compute_type_once_on_a_window_and_keeps_the_fastest(timing, monkeypatch, capsys):
    monkeypatch.setattr(tuning, "_bfloat16_shortlisted", lambda loaded: False)
    windows = []
    real_window = tuning.window_seconds
    monkeypatch.setattr(tuning, "window_seconds",
                        lambda model, mel: windows.append(compute.compute_type_of(model)) or real_window(model, mel))
    model = tuning.fastest("small", torch.device("cpu"), _small_at)
    costs = model.compute_type_costs
    assert compute.compute_type_of(model) == tuning.choose(costs) and set(costs) == {"float32", "int8"}
    # a warm-up and one or two timings of each type, alternating
    rounds = len(windows) // len(costs)
    assert windows == list(costs) * rounds and 2 <= rounds <= 1 + JOB_ROUNDS
    saved = json.loads(next((timing.path.parent).glob("*.json")).read_text())["choices"]
    assert saved[tuning.job_name("small")]["us"] == pytest.approx(costs, abs=0.1)
    said = capsys.readouterr().err
    assert "timing small at" in said and f"-> {compute.compute_type_of(model)}" in said
    monkeypatch.setattr(tuning, "window_seconds", lambda *a: pytest.fail("timed again"))
    assert compute.compute_type_of(tuning.fastest("small", torch.device("cpu"), _small_at)) == \
        compute.compute_type_of(model)


def test_a_first_run_times_no_job_and_takes_the_nearest_recorded_kinds_choice(unpinned, monkeypatch):
    """What auto and the float32 routes would time is what the kind nearest this CPU measured; with
    no recorded kind, float32 and whisper's products (the exact type, the plain route)."""
    from medusa_whisper.step import kinds, routes

    for module, name in ((tuning, "measure"), (tuning, "_time_routes"), (tuning, "measure_proposers"),
                         (encoder_form, "measure")):
        monkeypatch.setattr(module, name, lambda *a, **k: pytest.fail("a job timed on a first run"))
    monkeypatch.setattr(kinds, "profiles", lambda: {})
    model = tuning.fastest("small", torch.device("cpu"), _small_at)
    assert compute.compute_type_of(model) == "float32" and tuning.float32_routes(model) is False
    here = kinds.this_cpu()
    recorded = {"kind": "like-this", "cpu": here, "choices": {
        tuning.job_name("small"): {"route": "int8", "us": {"float32": 2.0e6, "int8": 1.0e6}},
        tuning.routes_job_name(SMALL): {"route": "measured", "us": {"measured": 1.0e6, "whisper": 2.0e6}}}}
    unlike = {"kind": "unlike", "cpu": {"vendor": "other", "isa": "none"}, "choices": {
        tuning.job_name("small"): {"route": "float32", "us": {"float32": 1.0e6, "int8": 2.0e6}}}}
    monkeypatch.setattr(kinds, "profiles", lambda: {"unlike": unlike, "like-this": recorded})
    routes._TABLES.clear()
    model = tuning.fastest("small", torch.device("cpu"), _small_at)
    assert compute.compute_type_of(model) == "int8" and model.compute_type_costs == {"float32": 2.0e6, "int8": 1.0e6}
    assert tuning.float32_routes(_small_at("float32")) is True
    table = routes.table()
    assert table.choices[tuning.job_name("small")]["predicted"] == "like-this"
    kept = [json.loads(path.read_text())["choices"] for path in (unpinned / "routes").glob("*.json")]
    assert not [name for table in kept for name in table if "job" in name]  # a prediction is not kept
    assert any("predicted from like-this" in line for line in table.describe())


def test_auto_is_named_in_a_transcriptions_statistics(monkeypatch, tmp_path):
    table = RouteTable(None)
    table.choices[tuning.job_name("tiny.en")] = {"route": "int8", "us": {"float32": 2.0e6, "int8": 1.0e6}}
    monkeypatch.setattr(tuning, "routes_table", lambda: table)
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="auto")
    assert model.compute_type == "int8"
    stats = medusa_whisper.transcribe(model, timing_clip.samples()[: 16000 * 5], language="en")["medusa"]
    assert stats["compute_type"] == "int8" and stats["encoder"] == model.encoder_form


def test_the_command_line_takes_auto_and_says_what_it_chose_when_verbose(monkeypatch, tmp_path, capsys):
    table = RouteTable(None)
    table.choices[tuning.job_name("tiny.en")] = {"route": "float32", "us": {"float32": 1.0e6, "int8": 1.5e6}}
    monkeypatch.setattr(tuning, "routes_table", lambda: table)
    clip = tmp_path / "clip.flac"
    clip.write_bytes(timing_clip.CLIP.read_bytes())
    assert main(["transcribe", str(clip), "--model", "tiny.en", "--compute-type", "auto", "--verbose", "True",
                 "--language", "en", "--clip-timestamps", "0,4"]) == 0
    err = capsys.readouterr().err
    assert "--compute-type auto: float32 (this machine's timing of a window: float32 1.00 s, int8 1.50 s)" in err


# --- medusa-whisper tune --------------------------------------------------------------------------


def test_tune_times_the_jobs_again_and_prints_what_it_chose(unpinned, monkeypatch, capsys):
    """Its plumbing, on jobs that cost nothing (each job's timing has its own test above)."""
    from medusa_whisper.decoding import batches
    from medusa_whisper.step import routes as routes_module

    stale = {"route": "bfloat16", "us": {"float32": 9.0e6, "int8": 9.0e6, "bfloat16": 1.0}}
    table = routes_module.table()
    table.choices[tuning.job_name("tiny.en")] = stale
    table._save()
    timed = []
    monkeypatch.setattr(tuning, "measure", lambda name, *a, **k: timed.append(name) or {"float32": 2.0e6, "int8": 1.0e6})
    monkeypatch.setattr(tuning, "_time_routes", lambda *a: timed.append("routes") or {"measured": 1.0, "whisper": 1.0})
    monkeypatch.setattr(encoder_form, "measure", lambda *a, **k: timed.append("encoder") or
                        {"product float32": 1.0, "encoder float32": 1.0})
    monkeypatch.setattr(batches, "_job", lambda model, batch, n: {1: 3.0, 2: 1.0}.get(batch, 1.0))
    monkeypatch.setattr(batches, "BATCH_SIZES", (1, 2))
    assert main(["tune", "--model", "tiny.en", "--threads", "2"]) == 0
    out = capsys.readouterr().out
    assert timed[0] == "tiny.en" and "encoder" in timed  # the kept choice was timed again, and the int8 encoder
    saved = json.loads(next((unpinned / "routes").glob("*.json")).read_text())["choices"]
    assert saved[tuning.job_name("tiny.en")]["us"] == {"float32": 2.0e6, "int8": 1.0e6}
    assert "compute type for tiny.en (auto):" in out and "-> int8" in out
    assert "int8 encoder form" in out and "default --batch-size" in out
    assert not table.timing  # tune's timing ends with it


def test_forgetting_drops_choices_in_memory_and_on_disk(tmp_path):
    path = tmp_path / "routes.json"
    table = RouteTable(path)
    table.costs("compute type job a", lambda: {"float32": 1.0})
    table.costs("kept", lambda: {"x": 1.0})
    assert table.forget("compute type job") == ["compute type job a"]
    assert set(json.loads(path.read_text())["choices"]) == {"kept"}
    again = []
    table.costs("compute type job a", lambda: again.append(1) or {"float32": 2.0})
    assert again == [1]


# --- float32: the products' routes, or whisper's ------------------------------------------------------


def test_the_float32_decoder_keeps_the_measured_routes_only_where_its_job_finds_them_faster(monkeypatch):
    from medusa_whisper.step import routes

    table = RouteTable(None)
    monkeypatch.setattr(tuning, "routes_table", lambda: table)
    model = random_model(MedusaConfig(num_heads=1))
    weight = model.decoder.blocks[0].mlp[0].weight
    name = tuning.routes_job_name(model.dims)
    try:
        for measured, whispers, kept in ((1.0, 2.0, True), (1.0, 1.02, False), (2.0, 1.0, False)):
            table.choices[name] = {"route": "", "us": {"measured": measured, "whisper": whispers}}
            assert tuning.float32_routes(model) is kept
            assert (tuple(weight.shape) in routes._JOB_SAYS_WHISPER) is not kept
            if not kept:  # for one row; more rows keep the measured routes, which the job did not time
                assert routes.route_for("linear", weight, 1) == routes.WHISPER_ROUTE
    finally:
        routes.whispers_route_for([tuple(weight.shape), tuple(model.decoder.token_embedding.weight.shape)], False)


def test_the_float32_routes_job_is_timed_once_on_the_timing_clip(timing, monkeypatch, capsys):
    from medusa_whisper.step import routes

    model = _small_at("float32")
    try:
        kept = tuning.float32_routes(model)
        saved = json.loads(next(timing.path.parent.glob("*.json")).read_text())["choices"]
        costs = saved[tuning.routes_job_name(model.dims)]["us"]
        assert set(costs) == {"measured", "whisper"} and kept == (costs["measured"] * tuning.TIE < costs["whisper"])
        assert (tuple(model.decoder.token_embedding.weight.shape) in routes._JOB_SAYS_WHISPER) is not kept
        assert "timing the float32 decoder's products" in capsys.readouterr().err
        monkeypatch.setattr(tuning, "_time_routes", lambda *a: pytest.fail("timed again"))
        assert tuning.float32_routes(model) == kept
    finally:
        routes.whispers_route_for([tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)]
                                  + [tuple(model.decoder.token_embedding.weight.shape)], False)


# --- the proposer of a -auto name (the default model) -------------------------------------------------


def _job(costs, short=None):
    """The proposer job's costs for windows of both lengths: each name's ``costs`` (its ``short``
    cost for the short window where given)."""
    lengths = [f"{round(timing_clip.seconds() * f, 1):g}" for f in tuning.PROPOSER_JOB_LENGTHS]
    short = short or {}
    return {f"{name}@{length}": short.get(name, us) if i == 0 else us
            for name, us in costs.items() for i, length in enumerate(lengths)}


def test_the_proposer_is_plain_unless_one_is_a_tie_faster_and_slower_at_no_length():
    assert tuning.choose_proposer("tiny.en", _job({"tiny.en": 1.0, "tiny.en-ctc": 0.9, "tiny.en-eagle": 0.8})) \
        == "tiny.en-eagle"
    # 3 % and 8 % faster: within what a window's timing varies, not worth its heads, plain decoding kept
    assert tuning.choose_proposer("tiny.en", _job({"tiny.en": 1.0, "tiny.en-medusa": 0.97})) == "tiny.en"
    assert tuning.choose_proposer("tiny.en", _job({"tiny.en": 1.0, "tiny.en-medusa": 0.92})) == "tiny.en"
    assert tuning.choose_proposer("base", _job({"base": 1.0, "base-ctc": 1.4})) == "base"
    # as measured on the AVX2 EPYC of family 23 (seconds, 4.6-s and 23-s windows): the CTC head is 9 %
    # faster on the long window and 4.5 % slower on the short one, so not taken; eagle is
    plain, ctc, eagle = {"tiny.en@4.6": 1.176, "tiny.en@23": 2.868}, {"tiny.en-ctc@4.6": 1.229, "tiny.en-ctc@23": 2.610}, \
        {"tiny.en-eagle@4.6": 1.149, "tiny.en-eagle@23": 2.802}
    assert tuning.choose_proposer("tiny.en", {**plain, **ctc}) == "tiny.en"
    assert tuning.choose_proposer("tiny.en", {**plain, **ctc, **dict(eagle, **{"tiny.en-eagle@23": 2.4})}) \
        == "tiny.en-eagle"
    assert tuning.choose_proposer("tiny.en", {**plain, **ctc, **eagle}) == "tiny.en"  # 2.4 %: within the tie
    assert tuning.auto_base("tiny.en-auto") == "tiny.en" and tuning.auto_base("large-v3-auto") == "large-v3"
    assert tuning.auto_base("tiny.en") is None and tuning.auto_base("nonsense-auto") is None


def test_a_smaller_whisper_is_a_candidate_draft_where_it_loads_without_a_download(monkeypatch):
    from medusa_whisper.checkpoints import weights

    assert weights.draft_pair("base+tiny.en") == ("base", "tiny.en")
    assert weights.draft_pair("base-ctc+eagle") is None and weights.draft_pair("base") is None
    monkeypatch.setattr(weights, "base_present", lambda name, manifest=None: name in ("tiny.en", "tiny", "base", "small"))
    assert weights.smaller_present("small") == ["tiny.en", "base", "tiny"]
    assert weights.smaller_present("tiny.en") == [] and weights.smaller_present("large-v3") == ["tiny.en", "base", "tiny", "small"]
    assert tuning.proposer_names("small")[-3:] == ["small+tiny.en", "small+base", "small+tiny"]


def _named_loads(monkeypatch, costs):
    """load_model records the name of each model it loads on it, and a timed window costs half what
    ``costs`` says for that name (microseconds: the two windows of the job), so that the choice is
    known beforehand."""
    real_load = medusa_whisper.loading.load_model
    loads = []

    def load(name, *args, **kwargs):
        model = real_load(name, *args, **kwargs)
        if not str(name).endswith(tuning.AUTO_SUFFIX):
            loads.append(name)
            model.loaded_as = name
        return model
    monkeypatch.setattr(medusa_whisper.loading, "load_model", load)
    monkeypatch.setattr(medusa_whisper, "load_model", load)
    monkeypatch.setattr(tuning, "window_seconds", lambda model, mel: costs[model.loaded_as] / 1e6 / 2)
    return loads


def test_an_auto_name_times_its_installed_proposers_once_and_decodes_with_the_fastest(timing, monkeypatch):
    tmp_path = timing.path.parent.parent
    names = tuning.proposer_names("tiny.en")
    assert names[0] == "tiny.en" and {"tiny.en-medusa", "tiny.en-eagle", "tiny.en-ctc"} <= set(names)
    costs = {name: 2.0e6 for name in names}
    costs["tiny.en-ctc"] = 1.0e6
    loads = _named_loads(monkeypatch, costs)
    model = medusa_whisper.load_model("tiny.en-auto", device="cpu")
    assert loads == names  # each loaded once, timed, and the fastest kept
    assert model.proposer_name == "tiny.en-ctc" and model.draft_head.kind == "ctc"
    assert model.proposer_costs == pytest.approx(_job({name: us / 2 for name, us in costs.items()}))
    saved = json.loads(next((tmp_path / "routes").glob("*.json")).read_text())["choices"]
    job = tuning.proposer_job_name("tiny.en", "float32", torch.device("cpu"))
    assert saved[job]["us"] == pytest.approx(model.proposer_costs, abs=0.1)

    loads.clear()
    monkeypatch.setattr(tuning, "window_seconds", lambda *a: pytest.fail("timed again"))
    again = medusa_whisper.load_model("tiny.en-auto", device="cpu")
    assert loads == ["tiny.en-ctc"] and again.proposer_name == "tiny.en-ctc"
    audio = timing_clip.samples()[: 16000 * 8]
    result = medusa_whisper.transcribe(again, audio, language="en")
    plain = medusa_whisper.transcribe(medusa_whisper.load_model("tiny.en", device="cpu"), audio, language="en", mode="off")
    assert result["medusa"]["proposer"] == "tiny.en-ctc" and result["medusa"]["tokens_per_step"] > 1
    assert [s["tokens"] for s in result["segments"]] == [s["tokens"] for s in plain["segments"]]


def test_an_auto_name_is_timed_again_when_its_installed_heads_change(monkeypatch, tmp_path):
    table = RouteTable(None)
    table.timing = "jobs"  # tune's: a first run predicts instead (test_a_first_run_...)
    job = tuning.proposer_job_name("tiny.en", "int8", torch.device("cpu"))
    table.choices[job] = {"route": "", "us": _job({"tiny.en": 2.0, "tiny.en-medusa": 1.0})}
    monkeypatch.setattr(tuning, "routes_table", lambda: table)
    costs = {name: 1.0e6 for name in tuning.proposer_names("tiny.en")}
    loads = _named_loads(monkeypatch, costs)
    model = medusa_whisper.load_model("tiny.en-auto", device="cpu", compute_type="int8")
    assert loads == list(costs) and set(tuning.costs_by_proposer(table.choices[job]["us"])) == set(costs)
    assert model.proposer_name == "tiny.en" and model.draft_head is None  # all tie: plain decoding
    assert compute.compute_type_of(model) == "int8"


def test_the_default_command_says_which_proposer_it_took_when_verbose_and_times_none_for_mode_off(
        monkeypatch, tmp_path, capsys):
    table = RouteTable(None)
    costs = {name: 2.0e6 for name in tuning.proposer_names("tiny.en")}
    costs["tiny.en-eagle"] = 1.0e6
    table.choices[tuning.proposer_job_name("tiny.en", "float32", torch.device("cpu"))] = {"route": "",
                                                                                         "us": _job(costs)}
    monkeypatch.setattr(tuning, "routes_table", lambda: table)
    loads = _named_loads(monkeypatch, costs)
    clip = tmp_path / "clip.flac"
    clip.write_bytes(timing_clip.CLIP.read_bytes())
    args = [str(clip), "--verbose", "True", "--clip-timestamps", "0,4"]
    assert medusa_whisper.DEFAULT_MODEL == "tiny.en-auto"
    assert main(["transcribe", *args]) == 0
    assert loads == ["tiny.en-eagle"]
    assert ("tiny.en-auto: tiny.en-eagle (this machine's timing of a short and a long window: tiny.en 2.00 + 2.00 s"
            in capsys.readouterr().err)
    loads.clear()
    table.choices.clear()  # mode off and beam search load plain tiny.en: nothing timed
    assert main(["transcribe", *args, "--mode", "off"]) == 0
    assert main(["transcribe", *args, "--beam-size", "2"]) == 0
    assert loads == ["tiny.en", "tiny.en"] and "tiny.en-auto:" not in capsys.readouterr().err
