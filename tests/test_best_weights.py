"""Early stopping by keeping the best (training/best.py): the weights of the best held-out score are
the ones a training run ends with, and a resumed run remembers them."""

import torch
from torch import nn

from medusa_whisper.training.best import BestWeights


def _weights(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_the_best_offer_is_restored_and_survives_a_resume(tmp_path):
    module = nn.Linear(3, 2)
    best = BestWeights(tmp_path, "tokens_per_step")
    kept = {}
    for step, score in ((10, 1.5), (20, 1.9), (30, 1.7), (40, 1.9)):  # 40 ties 20: the earlier stays
        with torch.no_grad():
            module.weight.fill_(step)
        if best.offer(module, step, {"tokens_per_step": score, "loss": 0.0}):
            kept[step] = _weights(module)
    assert list(kept) == [10, 20]
    assert not best.offer(module, 50, {"loss": 0.0}) and not best.offer(module, 60, None)  # nothing to compare

    resumed = BestWeights(tmp_path, "tokens_per_step")  # a new process: it reads work_dir/best.pt
    assert (resumed.step, resumed.score) == (20, 1.9)
    assert not resumed.offer(module, 70, {"tokens_per_step": 1.8})
    restored = resumed.restore(module)
    assert restored == {"step": 20, "metric": "tokens_per_step", "score": 1.9}
    for name, tensor in module.state_dict().items():
        assert torch.equal(tensor, kept[20][name]), name

    resumed.forget()
    assert resumed.restore(module) is None and resumed.offer(module, 80, {"tokens_per_step": 0.5})
