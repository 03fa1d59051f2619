"""CPU tier: the timer's bookkeeping around the GPU (``bench.held``), with the hold
kernel and the events stood in for: how long it holds the stream, and that a batch of
launches the host queued more slowly than the hold lasted is timed again behind a
longer one.  What the figures are on a GPU is the GPU tier's (test_gpu.py)."""

import time

from specgen import bench


class Event:
    """A stand-in CUDA event: the host's clock when recorded."""

    def record(self):
        self.at = time.perf_counter()

    def synchronize(self):
        pass


def run(monkeypatch, seconds_of):
    """``held`` over launches whose host side takes ``seconds_of(call)``; the holds it
    asked for (ms) and the figures it returned."""
    holds, calls = [], []
    monkeypatch.setattr(bench, "hold", lambda ms, stream=None: holds.append(ms))

    def launch(i):
        calls.append(i)
        t = time.perf_counter()
        while time.perf_counter() - t < seconds_of(len(calls)):
            pass

    figures = bench.held(
        launch, 5, 3, 2, lambda: (Event(), Event()), lambda a, b: (b.at - a.at) * 1e3
    )
    return holds, figures, calls


def test_the_hold_is_twice_the_queueing_the_warm_up_measured(monkeypatch):
    holds, figures, calls = run(monkeypatch, lambda n: 1e-4)
    assert len(figures) == 5 and calls[:3] == [0, 1, 0]  # warm-up over the 2 input sets
    # the fastest warm-up launch (0.1 ms) and two event records (0.02 ms), for 5; a
    # busy host may stretch the launches (and time them again), never shorten them
    assert holds[0] >= 2 * 5 * 0.12


def test_launches_queued_slower_than_the_hold_are_timed_again_behind_a_longer_one(
    monkeypatch,
):
    # fast warm-up launches, then the first timed batch ten times slower
    holds, figures, calls = run(monkeypatch, lambda n: 1e-4 if n <= 3 or n > 8 else 1e-3)
    assert len(holds) >= 2 and holds[1] > holds[0] and len(calls) >= 3 + 5 + 5
    assert len(figures) == 5


def test_the_hold_never_passes_its_cap(monkeypatch):
    holds, figures, _ = run(monkeypatch, lambda n: 0.02 if n > 3 else 1e-4)
    assert holds[-1] == bench.HOLD_MS_MAX and len(figures) == 5
