"""tools/bench/pass_kernels.py counts the operators of a pass that would launch a kernel, by part:
views, allocations and host-side scalars count for nothing, an operator counts once however it
allocates its output, and the outermost ``part:`` scope owns what runs inside it."""

import torch

from tools.bench.pass_kernels import PARTS, kernels_by_part, scoped


def profiled(run):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    return kernels_by_part(prof.events())


def test_views_and_allocations_count_for_nothing_and_each_operator_once():
    a, index = torch.arange(12.0).view(3, 4), torch.zeros(3, 2, dtype=torch.long)

    def run():
        with torch.profiler.record_function("part:draft"):
            b = a.view(4, 3).t()  # views: no kernel
            torch.empty(5)  # an allocation: none
            torch.where(a > 2, 1.0, 0.0)  # gt and where (its Python numbers are host-side)
            a.gather(1, index)  # one kernel, though it allocates its output first
        (b * 2).sum()  # outside every part: the loop's
    counts = profiled(run)
    assert counts["draft"] == 3
    assert counts["loop"] >= 2
    assert set(counts) == set(PARTS)


def test_the_outermost_part_owns_what_runs_inside_it():
    x = torch.ones(4)

    def run():
        with torch.profiler.record_function("part:window"):
            with torch.profiler.record_function("part:step"):
                x.add(1)
    counts = profiled(run)
    assert counts["window"] == 1 and counts["step"] == 0


def test_a_scoped_method_is_labelled_and_put_back():
    class Owner:
        def work(self, t):
            return t.mul(3)

    original, t = Owner.__dict__["work"], torch.ones(2)
    with scoped(Owner, "work", "part:rules"):
        counts = profiled(lambda: Owner().work(t))
    assert counts["rules"] == 1 and counts["loop"] == 0
    assert Owner.__dict__["work"] is original
