"""Windows decoded side by side (decoding/batches.py, on the CPU's products) get what each gets decoded alone."""

import pytest
import torch
import whisper

import medusa_whisper
from medusa_whisper.decoding.batches import BatchDecoder, batchable, decode_windows
from medusa_whisper.decoding.window import decode
from medusa_whisper.options import MedusaDecodingOptions

CLIPS = ["tests/data/real/jfk.flac", "tests/data/espeak_weather.flac", "tests/data/flite_recipe.flac",
         "tests/data/espeak_meeting.flac", "tests/data/flite_train.flac"]


@pytest.fixture(scope="module")
def mels():
    return [whisper.log_mel_spectrogram(whisper.pad_or_trim(whisper.load_audio(f)), 80) for f in CLIPS]


def _windows(mels):
    """Seven windows of five clips, with and without timestamps, a prompt, and one that must stop
    after a single token (it ends on its prompt pass), so streams end at different steps and items
    are refilled."""
    plain = MedusaDecodingOptions(mode="off", fp16=False, language="en")
    variants = [plain, MedusaDecodingOptions(mode="off", fp16=False, language="en", without_timestamps=True,
                                             prompt=[440, 2068, 7586]),
                MedusaDecodingOptions(mode="lossless", fp16=False, language="en", sample_len=1)]
    return [(i, mels[i % len(mels)], variants[i % len(variants)]) for i in range(7)]


def test_int8_windows_side_by_side_equal_each_alone_bit_for_bit(mels):
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    windows = _windows(mels)
    alone = {key: decode(model, mel, options) for key, mel, options in windows}
    together = dict(decode_windows(model, windows, batch_size=3))
    assert sorted(together) == sorted(alone)
    for key, expected in alone.items():
        got = together[key]
        assert got.tokens == expected.tokens, key
        # the same logits, not just the same argmax: the sums of log-probabilities are equal too
        assert got.avg_logprob == expected.avg_logprob and got.no_speech_prob == expected.no_speech_prob, key
        assert (got.text, got.language, got.temperature) == (expected.text, expected.language, expected.temperature)
    assert len(together[2].tokens) <= 1  # the one-token window


def test_float32_windows_side_by_side_give_the_same_text(mels):
    """float32's products are not row-invariant, so only the text is compared (equal on these clips)."""
    model = medusa_whisper.load_model("tiny.en", device="cpu")
    windows = _windows(mels)[:4]
    together = dict(decode_windows(model, windows, batch_size=4))
    for key, mel, options in windows:
        assert together[key].text == decode(model, mel, options).text, key


def test_a_batch_runs_as_few_passes_as_its_longest_window_needs(mels):
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    windows = [(i, mels[i], MedusaDecodingOptions(mode="off", fp16=False, language="en")) for i in range(4)]
    results = {}
    batch = BatchDecoder(model, batch_size=4)
    queue = list(windows)
    batch.run(lambda: queue.pop(0) if queue else None, results.__setitem__)
    longest = max(len(r.tokens) for r in results.values())
    # every window's prompt pass yields its first token; one batched pass per further token
    assert batch.passes <= longest + 2
    assert batch.rows == sum(r.decoder_steps - 1 for r in results.values())


def test_what_can_be_batched():
    base = MedusaDecodingOptions(fp16=False)
    assert batchable(base) and batchable(MedusaDecodingOptions(mode="off"))
    assert not batchable(MedusaDecodingOptions(mode="typical"))
    assert not batchable(MedusaDecodingOptions(temperature=0.2))
    assert not batchable(MedusaDecodingOptions(beam_size=5))
    with pytest.raises(ValueError):
        BatchDecoder(None, 0)


def test_recordings_transcribed_side_by_side_equal_each_alone_and_a_bad_one_does_not_stop_them(tmp_path):
    """Long and short recordings (a long one keeps whisper's window-after-window rule within itself),
    and a file that is not audio: each good one's segments equal ``transcribe`` alone, at int8."""
    from medusa_whisper.transcription.longform import transcribe, transcribe_many

    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    audio = [whisper.load_audio(f) for f in CLIPS]
    import numpy as np

    long_one = np.concatenate(audio + audio[:2])  # over 30 s: windows one after another, prompted by the last
    bad = tmp_path / "not_audio.wav"
    bad.write_bytes(b"this is not audio")
    inputs = [long_one, CLIPS[1], str(bad), CLIPS[0], audio[4]]
    failures = []
    many = transcribe_many(model, inputs, batch_size=3, fp16=False,
                           on_done=lambda i, result, error: failures.append(i) if error is not None else None)
    assert failures == [2] and many[2] is None
    for i in (0, 1, 3, 4):
        alone = transcribe(model, inputs[i], fp16=False)
        assert many[i]["segments"] == alone["segments"], i
        assert many[i]["text"] == alone["text"]
    assert len({s["seek"] for s in many[0]["segments"]}) >= 2  # the long one really had several windows


def test_the_command_line_batches_files_and_writes_what_one_by_one_writes(tmp_path, capsys):
    from medusa_whisper.cli import main

    bad = tmp_path / "broken.wav"
    bad.write_bytes(b"RIFF not really")
    files = [CLIPS[0], CLIPS[1], str(bad), CLIPS[3]]
    common = ["transcribe", *files, "--model", "tiny.en", "--compute-type", "int8", "-f", "all", "--threads", "2"]
    assert main(common + ["-o", str(tmp_path / "one"), "--batch-size", "1"]) == 1
    capsys.readouterr()
    assert main(common + ["-o", str(tmp_path / "batched"), "--batch_size", "3"]) == 1  # whisper's spelling too
    out, err = capsys.readouterr()
    assert err.count("broken.wav") == 1 and "Traceback" not in err
    assert "3 files done, 1 failed" in err
    written = sorted(p.name for p in (tmp_path / "batched").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "one").iterdir()) and len(written) == 3 * 5
    for name in written:
        assert (tmp_path / "batched" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name


def test_several_int8_files_are_batched_by_default_and_float32_only_when_asked():
    from medusa_whisper.cli import INT8_FILES_BATCH, build_parser, files_batch

    def batch(*extra, n_files=3):
        return files_batch(build_parser().parse_args(["transcribe", "a.wav", *extra]), n_files)

    assert batch("--compute-type", "int8") == INT8_FILES_BATCH > 1
    assert batch("--compute-type", "int8", n_files=1) == 1
    assert batch() == 1  # float32: a batched row may differ in a logit's last bits
    assert batch("--batch-size", "3") == 3 and batch("--compute-type", "int8", "--batch_size", "1") == 1


def test_the_python_api_takes_a_list():
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    results = medusa_whisper.transcribe(model, CLIPS[:2], batch_size=2, fp16=False)
    assert [r["text"] for r in results] == [medusa_whisper.transcribe(model, c, fp16=False)["text"] for c in CLIPS[:2]]


def test_each_recording_samples_from_its_own_random_state():
    """Fallback sampling draws from torch's global generator: per recording, the draws are those of a
    fresh process whatever other recordings drew in between."""
    from medusa_whisper.transcription.longform import own_random_state

    states = {}
    fresh = torch.Generator().get_state()
    with torch.random.fork_rng(devices=[]):
        torch.set_rng_state(fresh)
        alone = torch.rand(6)
    with own_random_state(states, "a"):
        first = torch.rand(3)
    with own_random_state(states, "b"):
        other = torch.rand(3)
    with own_random_state(states, "a"):
        second = torch.rand(3)
    assert torch.equal(torch.cat([first, second]), alone) and torch.equal(other, alone[:3])


def test_the_default_batch_size_is_the_cheapest_token_measured_here_or_none():
    from medusa_whisper.decoding.batches import choose_batch_size
    assert choose_batch_size({1: 10.0, 2: 7.0, 4: 5.0, 8: 4.1, 16: 4.0}) == 8  # 8 is within 5 % of the best
    assert choose_batch_size({1: 10.0, 2: 7.0, 4: 5.0, 8: 4.3, 16: 4.0}) == 16
    assert choose_batch_size({1: 10.0, 2: 9.6, 4: 9.5, 8: 9.8, 16: 11.0}) == 1  # batching saves under 10 %
    assert choose_batch_size({1: 10.0, 2: 12.0, 4: 15.0}) == 1  # a CPU where a batch costs more per token


def test_the_default_batch_size_is_the_whole_job_measured_once_per_machine(unpinned, monkeypatch):
    from medusa_whisper.decoding import batches
    from medusa_whisper.step import routes
    routes.table().timing = "jobs"  # as tune times it (a first run predicts it: test_tuning)
    from medusa_whisper.cli import build_parser, files_batch
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    jobs = []
    real = batches._job
    monkeypatch.setattr(batches, "_job", lambda m, b, n: jobs.append((b, n)) or real(m, b, n))
    monkeypatch.setattr(batches, "JOB_TOKENS", (3, 6, 2))  # a short job: its lengths cycled over the windows
    costs = batches.token_costs(model, (1, 4))
    # a warm-up, then the windows one by one and through the batch loop, refilled
    assert sorted(costs) == [1, 4] and all(c > 0 for c in costs.values()) and jobs == [(2, 2), (1, 3), (4, 6)]
    assert batches.token_costs(model, (1, 4)) == costs and len(jobs) == 3  # kept: measured once
    name = next(n for n in routes.table().choices if n.startswith("batched job int8"))
    assert routes.table().choices[name]["us"] == {str(k): round(v, 1) for k, v in costs.items()}
    args = build_parser().parse_args(["transcribe", "a.wav", "--compute-type", "int8"])
    monkeypatch.setattr(batches, "BATCH_SIZES", (1, 4))
    assert files_batch(args, 3, model) == batches.choose_batch_size(costs)
    assert files_batch(args, 1, model) == 1 and len(jobs) == 3


def test_the_timed_job_decodes_every_window_to_its_length(monkeypatch):
    """The job's windows run to their JOB_TOKENS lengths on both paths (end-of-text suppressed), so
    the two paths are timed on the same tokens."""
    from medusa_whisper.decoding import batches
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    counted = {}
    real_decode, real_windows = batches.decode, batches.decode_windows

    def decode(*args, **kwargs):
        result = real_decode(*args, **kwargs)
        counted.setdefault(1, []).append(len(result.tokens))
        return result

    def decode_windows(model, windows, batch, narrow=True):
        assert not narrow  # the job holds its width: it is what the loop's own check compares with
        for key, result in real_windows(model, windows, batch, narrow):
            counted.setdefault(batch, []).append(len(result.tokens))
            yield key, result
    monkeypatch.setattr(batches, "decode", decode)
    monkeypatch.setattr(batches, "decode_windows", decode_windows)
    monkeypatch.setattr(batches, "JOB_TOKENS", (3, 7, 5))
    batches._job(model, 1, 3)
    batches._job(model, 2, 3)
    assert counted[1] == [3, 7, 5] and sorted(counted[2]) == [3, 5, 7]


def test_the_default_follows_the_job_where_the_steady_pass_disagrees(monkeypatch):
    """Recorded on the AVX2 EPYC (issue 46): a steady batched pass made a token 2.6x cheaper at 16
    than at 1, yet the archive took longer at 16 than one file after another. The choice is the
    job's: replayed from a table of job costs in that proportion, it is 1."""
    from medusa_whisper.decoding import batches
    from medusa_whisper.step import routes
    steady = {1: 18500.0, 4: 9800.0, 8: 8100.0, 16: 7200.0}  # us per token, a steady pass at position 60
    assert batches.choose_batch_size(steady) == 16
    job = {1: 63.0 / 70.3 * 13000.0, 4: 13600.0, 8: 13300.0, 16: 13000.0}  # the archive's proportion
    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    monkeypatch.setattr(routes.table(), "costs", lambda name, measure, **how: {str(k): v for k, v in job.items()})
    assert batches.default_batch_size(model) == 1


def test_the_loop_narrows_where_its_own_cost_a_token_is_above_decoding_alone():
    from medusa_whisper.decoding.batches import NARROW_AFTER, Narrowing

    narrowing = Narrowing(8, alone_us=100.0)
    widths = []
    for _ in range(2 * 8):  # a stretch at 8: 10 tokens a window at 300 us each, 3x decoding alone
        narrowing.spent(10 * 300e-6)
        widths.append(narrowing.window_done(10))
    assert widths == [8] * 15 + [4] and narrowing.checked == [(8, 300.0)]
    for _ in range(NARROW_AFTER):  # at 4 a token costs 50 us: kept, and checked again
        narrowing.spent(10 * 50e-6)
        narrowing.window_done(10)
    assert narrowing.width == 4 and narrowing.checked[-1] == (4, 50.0)
    assert Narrowing(8, alone_us=None).window_done(1) == 8  # nothing to hold it to: never narrows
    one = Narrowing(1, alone_us=1e-9)
    one.spent(1.0)
    assert one.window_done(1) == 1


def test_an_int8_batch_that_narrows_mid_run_still_equals_each_window_alone(mels, monkeypatch):
    """Held to an impossible cost, the loop halves its width every stretch down to 1; at int8 a
    window's result does not depend on its company, so every window still equals its decoding alone."""
    from medusa_whisper.decoding import batches

    model = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    monkeypatch.setattr(batches, "narrows", lambda model, products: 1e-9)
    monkeypatch.setattr(batches, "NARROW_AFTER", 2)
    windows = [(i, mels[i % len(mels)], MedusaDecodingOptions(mode="off", fp16=False, language="en"))
               for i in range(12)]
    decoder = batches.BatchDecoder(model, batch_size=4)
    queue, together = list(windows), {}
    decoder.run(lambda: queue.pop(0) if queue else None, together.__setitem__)
    assert [width for width, _ in decoder.narrowing.checked] == [4, 2] and decoder.narrowing.width == 1
    for key, mel, options in windows:
        alone = decode(model, mel, options)
        assert together[key].tokens == alone.tokens and together[key].avg_logprob == alone.avg_logprob, key


def test_only_a_batch_whose_results_do_not_depend_on_its_width_narrows(monkeypatch):
    from medusa_whisper.decoding import batches
    from medusa_whisper.step import routes

    table = routes.RouteTable(None)
    monkeypatch.setattr(batches, "routes_table", lambda: table)
    int8 = medusa_whisper.load_model("tiny.en", device="cpu", compute_type="int8")
    float32 = medusa_whisper.load_model("tiny.en", device="cpu")
    assert batches.narrows(int8, "cpu") is None  # no job timed here: nothing to hold it to
    table.choices[batches.batch_job_name(int8)] = {"route": "4", "us": {"1": 900.0, "4": 500.0}}
    assert batches.narrows(int8, "cpu") == 900.0
    assert batches.narrows(int8, "fixed") is None and batches.narrows(float32, "cpu") is None
