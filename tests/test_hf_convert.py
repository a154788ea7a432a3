"""Hugging Face checkpoints, converted: the same logits as the original weights give.

Small random checkpoints are built with transformers in every layout: plain
WhisperForConditionalGeneration (safetensors, sharded safetensors, pytorch_model.bin) and
Whisper-Medusa with ``base_head`` and ``medusa_block`` heads (as aiola's code saves them: the
Whisper part under ``whisper_model.``, proj_out absent). The reference computation is transformers'
own forward for the Whisper part and FACTS.md's formulas for the Medusa parts:
RB(x) = x + SiLU(W x + b) per layer, logits = E · RB_k(h), and for medusa_block a transformers
WhisperDecoderLayer over the decoder's final state h with the encoder output.
"""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402
from transformers import WhisperConfig, WhisperForConditionalGeneration  # noqa: E402
from transformers.models.whisper.modeling_whisper import WhisperDecoderLayer  # noqa: E402

import medusa_whisper  # noqa: E402
from medusa_whisper.checkpoints.convert import convert  # noqa: E402
from medusa_whisper.errors import CheckpointError  # noqa: E402
from medusa_whisper.training.features import teacher_forced_states  # noqa: E402

N_HEADS, N_LAYERS = 3, 2
TOKENS = [50258, 50259, 50359, 50363, 400, 1000, 2000, 300, 13, 50, 7000]  # sot, en, transcribe, notimestamps, text


def small_config(**overrides) -> WhisperConfig:
    settings = dict(vocab_size=51865, num_mel_bins=80, d_model=64, encoder_layers=2, decoder_layers=2,
                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=256, decoder_ffn_dim=256,
                    max_source_positions=1500, max_target_positions=448, decoder_start_token_id=50258,
                    pad_token_id=50257, bos_token_id=50257, eos_token_id=50257)
    settings.update(overrides)
    config = WhisperConfig(**settings)
    config._attn_implementation = "eager"
    return config


def random_whisper(config: WhisperConfig, seed: int = 0) -> WhisperForConditionalGeneration:
    torch.manual_seed(seed)
    model = WhisperForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger embeddings than the default init, so greedy tokens vary
        model.model.decoder.embed_tokens.weight.normal_(0, 0.5)
    return model


def random_heads(n_heads: int, d: int, seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {f"medusa_heads.{h}.{l}.linear.{kind}": torch.randn(shape, generator=generator) * 0.2
            for h in range(n_heads) for l in range(N_LAYERS)
            for kind, shape in (("weight", (d, d)), ("bias", (d,)))}


def medusa_checkpoint(folder, heads_type: str, sharded: bool, seed: int = 1):
    """A Whisper-Medusa directory as the reference saves it; returns (whisper, heads, block layer)."""
    config = small_config()
    whisper_hf = random_whisper(config, seed)
    n_heads = N_HEADS + (1 if heads_type == "base_head" else 0)
    heads = random_heads(n_heads, config.d_model, seed)
    tensors = {f"whisper_model.{k}": v for k, v in whisper_hf.state_dict().items() if k != "proj_out.weight"}
    tensors.update(heads)
    block = None
    if heads_type == "medusa_block":
        torch.manual_seed(seed + 10)
        block = WhisperDecoderLayer(config, layer_idx=config.decoder_layers).eval()
        tensors.update({f"medusa_block.{k}": v for k, v in block.state_dict().items()})
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if sharded:
        names = sorted(tensors)
        halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
                  "model-00002-of-00002.safetensors": names[len(names) // 2:]}
        weight_map = {}
        for file, keys in halves.items():
            save_file({k: tensors[k] for k in keys}, str(folder / file))
            weight_map.update({k: file for k in keys})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    else:
        save_file(tensors, str(folder / "model.safetensors"))
    medusa_config = config.to_dict()
    medusa_config.update(medusa_num_heads=N_HEADS, medusa_num_layers=N_LAYERS, medusa_heads_type=heads_type,
                         medusa_hidden_size=config.d_model, whisper_model_name="openai/whisper-tiny")
    (folder / "config.json").write_text(json.dumps(medusa_config))
    return whisper_hf, heads, block


def residual_stack(x, heads: dict, head: int):
    for layer in range(N_LAYERS):
        w, b = heads[f"medusa_heads.{head}.{layer}.linear.weight"], heads[f"medusa_heads.{head}.{layer}.linear.bias"]
        x = x + F.silu(x @ w.T + b)
    return x


def causal_mask(length: int) -> torch.Tensor:
    return torch.full((length, length), float("-inf")).triu(1)[None, None]


@pytest.fixture(scope="module")
def mel():
    return torch.randn(80, 3000, generator=torch.Generator().manual_seed(3))


def ours_logits(model, mel):
    """Base and head logits of our converted model over TOKENS, teacher-forced: (L, V), (K, L, V)."""
    tokens = torch.tensor([TOKENS])
    audio = model.embed_audio(mel[None])
    _, hidden = teacher_forced_states(model, audio, tokens)
    embedding = model.decoder.token_embedding.weight
    base = model.medusa.base_state(hidden) @ embedding.T
    if model.num_heads == 0:
        return base[0], None
    head_input = hidden
    if model.medusa.block is not None:
        head_input = model.medusa.block(hidden, audio, mask=model.decoder.mask)
    states = model.medusa.head_states(head_input)  # (1, K, L, n_state)
    return base[0], (states @ embedding.T)[0]


def reference_hidden(whisper_hf, mel):
    out = whisper_hf.model(input_features=mel[None], decoder_input_ids=torch.tensor([TOKENS]))
    return out.last_hidden_state, out.encoder_last_hidden_state


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin"])
@torch.no_grad()
def test_plain_whisper_converts_to_the_same_logits_and_greedy_tokens(tmp_path, mel, layout):
    whisper_hf = random_whisper(small_config())
    source = tmp_path / "hf"
    whisper_hf.save_pretrained(source, safe_serialization=layout != "bin",
                               max_shard_size="2MB" if layout == "sharded" else "10GB")
    if layout == "sharded":
        assert (source / "model.safetensors.index.json").is_file()
    convert(source, tmp_path / "model.pt")
    model = medusa_whisper.load_model(str(tmp_path / "model.pt"), device="cpu")

    expected = whisper_hf(input_features=mel[None], decoder_input_ids=torch.tensor([TOKENS])).logits[0]
    base, _ = ours_logits(model, mel)
    torch.testing.assert_close(base, expected, atol=1e-4, rtol=0)

    # greedy: transformers' own decoding loop against medusa_whisper.decode (no logit filters on either side)
    generated = transformers.GenerationMixin.generate(
        whisper_hf, input_features=mel[None], decoder_input_ids=torch.tensor([TOKENS[:4]]), max_new_tokens=12,
        do_sample=False, num_beams=1, eos_token_id=50257, pad_token_id=50257, suppress_tokens=None,
        begin_suppress_tokens=None, forced_decoder_ids=None)[0, 4:].tolist()
    ours = medusa_whisper.decode(model, mel, language="en", without_timestamps=True, suppress_tokens=None,
                                 suppress_blank=False, sample_len=12, fp16=False)
    assert ours.tokens == [t for t in generated if t != 50257][: len(ours.tokens)]
    assert len(ours.tokens) == len([t for t in generated if t != 50257])


@pytest.mark.parametrize("sharded", [False, True], ids=["single", "sharded"])
@pytest.mark.parametrize("heads_type", ["base_head", "medusa_block"])
@torch.no_grad()
def test_whisper_medusa_heads_give_the_reference_logits(tmp_path, mel, heads_type, sharded):
    whisper_hf, heads, block = medusa_checkpoint(tmp_path / "medusa", heads_type, sharded)
    convert(tmp_path / "medusa", tmp_path / "medusa.pt")
    model = medusa_whisper.load_model(str(tmp_path / "medusa.pt"), device="cpu")
    assert model.num_heads == N_HEADS
    assert model.medusa_config.heads_type == {"base_head": "base_head", "medusa_block": "block"}[heads_type]

    hidden, encoded = reference_hidden(whisper_hf, mel)
    embedding = whisper_hf.model.decoder.embed_tokens.weight
    if heads_type == "base_head":
        expected_base = residual_stack(hidden, heads, 0) @ embedding.T  # head 0 is the next-token head
        expected_heads = [residual_stack(hidden, heads, k) @ embedding.T for k in range(1, N_HEADS + 1)]
    else:
        expected_base = hidden @ embedding.T
        out = block(hidden, attention_mask=causal_mask(len(TOKENS)), encoder_hidden_states=encoded)
        block_out = out[0] if isinstance(out, tuple) else out
        expected_heads = [residual_stack(block_out, heads, k) @ embedding.T for k in range(N_HEADS)]

    base, head_logits = ours_logits(model, mel)
    torch.testing.assert_close(base, expected_base[0], atol=1e-4, rtol=0)
    for k in range(N_HEADS):
        torch.testing.assert_close(head_logits[k], expected_heads[k][0], atol=1e-4, rtol=0)


@torch.no_grad()
def test_base_head_lossless_decoding_is_the_models_own_greedy(tmp_path, mel):
    whisper_hf, heads, _ = medusa_checkpoint(tmp_path / "medusa", "base_head", sharded=False)
    convert(tmp_path / "medusa", tmp_path / "medusa.pt")
    model = medusa_whisper.load_model(str(tmp_path / "medusa.pt"), device="cpu")
    # the reference's greedy: argmax of E · RB_0(h) at each step, h from transformers
    tokens = list(TOKENS[:4])
    embedding = whisper_hf.model.decoder.embed_tokens.weight
    for _ in range(15):
        out = whisper_hf.model(input_features=mel[None], decoder_input_ids=torch.tensor([tokens]))
        token = int((residual_stack(out.last_hidden_state[0, -1], heads, 0) @ embedding.T).argmax())
        tokens.append(token)
        if token == 50257:
            break
    expected = [t for t in tokens[4:] if t != 50257]
    result = medusa_whisper.decode(model, mel, language="en", without_timestamps=True, suppress_tokens=None,
                                   suppress_blank=False, sample_len=15, fp16=False, mode="lossless")
    assert result.tokens == expected
    vanilla_argmax = medusa_whisper.decode(model, mel, language="en", without_timestamps=True, suppress_tokens=None,
                                           suppress_blank=False, sample_len=15, fp16=False, mode="off")
    assert vanilla_argmax.tokens == expected


def test_missing_tensor_is_named(tmp_path):
    medusa_checkpoint(tmp_path / "m", "medusa_block", sharded=False)
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    del tensors["medusa_block.encoder_attn.v_proj.weight"]
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing tensor .*medusa_block\.encoder_attn\.v_proj\.weight"):
        convert(tmp_path / "m", tmp_path / "out.pt")
    assert not (tmp_path / "out.pt").exists()


def test_misshaped_tensor_is_named(tmp_path):
    medusa_checkpoint(tmp_path / "m", "base_head", sharded=False)
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    tensors["whisper_model.model.decoder.layers.1.fc1.weight"] = torch.zeros(255, 64)
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.decoder\.layers\.1\.fc1\.weight has shape \(255, 64\), "
                                              r"expected \(256, 64\)"):
        convert(tmp_path / "m", tmp_path / "out.pt")


def test_unexpected_tensor_and_extra_head_are_named(tmp_path):
    medusa_checkpoint(tmp_path / "m", "base_head", sharded=False)
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "m" / "model.safetensors"))
    tensors["medusa_heads.9.0.linear.weight"] = torch.zeros(64, 64)  # config says 3+1 heads
    save_file(tensors, str(tmp_path / "m" / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"unexpected tensor medusa_heads\.9\.0\.linear\.weight"):
        convert(tmp_path / "m", tmp_path / "out.pt")


def test_cli_converts_and_reports_problems_in_one_line(tmp_path, capsys):
    from medusa_whisper.cli import main

    medusa_checkpoint(tmp_path / "m", "medusa_block", sharded=True)
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "m.pt")]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {tmp_path / 'm.pt'}"
    (tmp_path / "m" / "model-00002-of-00002.safetensors").unlink()
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "m2.pt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model-00002-of-00002.safetensors" in err and "Traceback" not in err


def test_hf_folder_loads_directly_by_path(tmp_path, mel):
    medusa_checkpoint(tmp_path / "m", "medusa_block", sharded=False)
    model = medusa_whisper.load_model(str(tmp_path / "m"), device="cpu")
    assert model.num_heads == N_HEADS and model.medusa.block is not None
    result = medusa_whisper.decode(model, mel, language="en", sample_len=8, fp16=False)
    assert np.isfinite(result.avg_logprob)


def test_published_names_download_once_then_load_from_the_cache(tmp_path, monkeypatch):
    """large-v2-medusa goes through huggingface_hub (replaced here by a local folder), is converted
    once and then comes from the cache; without a network the error is one line saying what to do."""
    huggingface_hub = pytest.importorskip("huggingface_hub")
    from medusa_whisper.checkpoints import weights
    from medusa_whisper.errors import DownloadError

    monkeypatch.setenv("MEDUSA_WHISPER_CACHE", str(tmp_path / "cache"))
    medusa_checkpoint(tmp_path / "snapshot", "base_head", sharded=True)
    calls = []

    def snapshot_download(repo, **kwargs):
        calls.append(repo)
        return str(tmp_path / "snapshot")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    model = medusa_whisper.load_model("large-v2-medusa", device="cpu")
    assert calls == ["aiola/whisper-medusa-v1"]
    assert model.medusa_config.heads_type == "base_head" and model.num_heads == N_HEADS
    medusa_whisper.load_model("large-v2-medusa", device="cpu")
    assert calls == ["aiola/whisper-medusa-v1"], "the second load must come from the cache"
    assert {row["name"]: row for row in weights.model_table()}["large-v2-medusa"]["present"]

    def offline(repo, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(DownloadError) as error:
        medusa_whisper.load_model("large-v2-medusa-block", device="cpu")
    message = str(error.value)
    assert "\n" not in message and "aiola/whisper-medusa-block-libri" in message
    assert "medusa-whisper convert DIR large-v2-medusa-block.pt" in message
