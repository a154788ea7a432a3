"""Several drafters at once (drafting/union.py): the merged tree, lossless decoding on a real recording
with a right and a corrupted draft side by side, and the ``<base>-ctc+eagle`` name, which reads the
two shipped kinds of heads files."""

import pytest
import torch

import medusa_whisper
from medusa_whisper.drafting.base import Committed, Proposer
from medusa_whisper.drafting.ctc import CtcConfig, CtcHead
from medusa_whisper.drafting.draft_head import draft_head_file
from medusa_whisper.drafting.eagle import EagleConfig, EagleHead
from medusa_whisper.drafting.tree import CandidateTree
from medusa_whisper.drafting.union import UnionHead, UnionProposer, merge_trees
from medusa_whisper.errors import ModelNotFoundError

from test_ctc import CHEAP_ROWS, CORRUPTED, JFK_TEXT, FixedDraft, _vanilla, jfk_mel, recorded, tiny  # noqa: F401 (fixtures)


def test_merged_trees_share_common_paths_and_map_every_node():
    chain = CandidateTree.chain([5, 6, 7])
    other = CandidateTree((5, 9, 6, 8), (-1, 0, 0, 2))  # 5 -> 9, 5 -> 6 -> 8
    union, maps = merge_trees([chain, other])
    assert union.tokens == (5, 6, 7, 9, 8)
    assert union.parents == (-1, 0, 1, 0, 1)
    assert maps == [[0, 1, 2], [0, 3, 1, 4]]
    for tree, mapping in zip([chain, other], maps):
        for node, parent in enumerate(tree.parents):  # each node keeps its token and its parent
            assert union.tokens[mapping[node]] == tree.tokens[node]
            assert union.parents[mapping[node]] == (mapping[parent] if parent >= 0 else -1)
    empty, empty_maps = merge_trees([CandidateTree(), chain])
    assert empty.tokens == chain.tokens and empty_maps == [[], [0, 1, 2]]


@pytest.mark.parametrize("without_timestamps", [True, False], ids=["no-timestamps", "timestamps"])
def test_a_union_is_lossless_and_takes_whichever_draft_is_right(tiny, jfk_mel, without_timestamps, recorded):
    expected = _vanilla(tiny, jfk_mel, without_timestamps)
    per_step = {}
    try:
        for name, texts in (("corrupted", [CORRUPTED]), ("right", [JFK_TEXT]),
                            ("corrupted+right", [CORRUPTED, JFK_TEXT])):
            parts = [FixedDraft(text, settings=CHEAP_ROWS) for text in texts]
            tiny.draft_head = UnionHead(parts)
            result = medusa_whisper.decode(tiny, jfk_mel, language="en", without_timestamps=without_timestamps)
            assert result.tokens == expected.tokens, name
            per_step[name] = result.tokens_per_step
            if name == "corrupted+right":
                # both parts saw every committed token: each re-synchronised its own draft
                # (the pass that ends the text commits nothing)
                assert [part.proposers[-1].counts["passes"] for part in parts] == [result.decoder_steps - 1] * 2
    finally:
        tiny.draft_head = None
    assert per_step["corrupted+right"] >= per_step["corrupted"] + 0.5, per_step
    assert per_step["corrupted+right"] >= 0.9 * per_step["right"], per_step


def test_the_union_tells_each_part_its_own_nodes():
    """A part's commit carries the verifier's predictions at its own nodes, numbered as it proposed them."""

    class Fixed(Proposer):
        def __init__(self, tree):
            super().__init__()
            self.tree, self.seen = tree, []

        def _propose(self):
            return self.tree

        def _commit(self, committed):
            self.seen.append(committed)

    a, b = Fixed(CandidateTree.chain([5, 6])), Fixed(CandidateTree.chain([5, 7]))
    union = UnionProposer([a, b])
    tree = union.propose()
    assert tree.tokens == (5, 6, 7)
    committed = Committed(
        tokens=[1, 5, 7], hidden=torch.zeros(1, 3, 4), position=0, next_token=9, n_accepted=2, n_proposed=3,
        predictions=[5, 7, 2, 9])  # after the root: 5; after 5: 7; after 6: 2; after 7: 9
    union.commit(committed)
    assert a.seen[0].predictions == [5, 7, 2] and a.seen[0].n_proposed == 2
    assert b.seen[0].predictions == [5, 7, 9] and b.seen[0].n_proposed == 2
    assert a.seen[0].tokens == b.seen[0].tokens == [1, 5, 7]
    assert union.led == [1, 1]  # the accepted path starts at the shared node


def test_ctc_plus_eagle_loads_by_name_from_the_two_heads_files(tiny, jfk_mel, tmp_path, monkeypatch):
    ctc = CtcHead(tiny.dims, CtcConfig(encoding="gpt2", n_units=256, width=64, layers=1))
    eagle = EagleHead(EagleConfig(n_state=tiny.dims.n_text_state, n_head=tiny.dims.n_text_head,
                                  n_ctx=tiny.dims.n_text_ctx, shortlist=512))
    torch.save(draft_head_file(ctc, "tiny.en", {"note": "untrained"}), tmp_path / "tiny.en-ctc.pt")
    torch.save(draft_head_file(eagle, "tiny.en", {"note": "untrained"}), tmp_path / "tiny.en-eagle.pt")
    monkeypatch.setenv("MEDUSA_WHISPER_HEADS_DIR", str(tmp_path))
    model = medusa_whisper.load_model("tiny.en-ctc+eagle", device="cpu")
    assert isinstance(model.draft_head, UnionHead)
    assert [type(p) for p in model.draft_head.parts] == [CtcHead, EagleHead]
    for original, loaded in zip((ctc, eagle), model.draft_head.parts):
        for (name, a), (_, b) in zip(original.state_dict().items(), loaded.state_dict().items()):
            assert torch.equal(a, b), name
    # whisper.decode's default options (fp16=True: half precision even on a CPU), which the EAGLE head
    # once failed on
    result = medusa_whisper.decode(model, jfk_mel, language="en", draft_tokens=2)
    assert result.tokens == medusa_whisper.decode(model, jfk_mel, language="en", mode="off").tokens
    (tmp_path / "tiny.en-eagle.pt").unlink()
    with pytest.raises(ModelNotFoundError, match="tiny.en-eagle.pt"):
        medusa_whisper.load_model("tiny.en-ctc+eagle", device="cpu")
