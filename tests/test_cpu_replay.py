"""CPU tier: the bookkeeping of a node's recording (``specgen.torch._replay``), on CPU
tensors and launches that only fill their slots: which argument is an address in
which of the call's tensors, which is a constant, how the results come back for
another call's tensors, and which bodies cannot be replayed.  The replays themselves
run on the GPU (tests/test_replay.py).  Skipped without PyTorch."""

import random

import pytest

torch = pytest.importorskip("torch")

from specgen.runtime import _Step  # noqa: E402
from specgen.torch import _replay  # noqa: E402


class Ctx:
    """Stands for autograd's ctx: attributes set on it."""


def launch(rec, values):
    """A launch reported to ``rec`` with these slot values (addresses or constants)."""
    st = _Step(0xF00, (1, 1, 1), (32, 1, 1), 0, [("a", 0)] * len(values))
    for i, v in enumerate(values):
        st.slots[i] = v
    rec.launched(st, [])


def test_arguments_are_addresses_in_the_calls_tensors_or_constants():
    """An argument inside an input, an allocation or a view of one is kept as that
    buffer and an offset; any other value as itself; and the results, an input, an
    allocation, a view and a ctx attribute holding an address, are rebuilt for a
    second call's tensors where they lie in those."""
    n = random.randrange(8, 64)
    x = torch.randn(4, n)
    rec = _replay.Recording((x, None))
    with rec:
        y = torch.empty(4, n)
        scratch = torch.empty(100, dtype=torch.float32)
        view = scratch[10:20]
    constant = random.randrange(1, 1 << 20)
    launch(rec, [x.data_ptr() + 16, y.data_ptr(), constant, view.data_ptr()])
    ctx = Ctx()
    ctx.scratch, ctx.at = scratch, (scratch.data_ptr() + 8, 99)
    record = rec.record((y, view, x, None), ctx, ("scratch", "at", "absent"))
    assert not rec.failed and record is not None
    assert [b[0] for b in record.buffers] == ["new", "new"]
    (step,) = record.steps
    assert step.fill == [(0, 0, 16), (1, 2, 0), (3, 3, 40)]
    assert list(step.slots)[2] == constant
    assert [name for name, _ in record.attrs] == ["scratch", "at"]

    x2 = torch.randn(4, n)
    made = [x2, None, torch.empty(4, n), torch.empty(100)]
    addresses = [x2.data_ptr(), 0, made[2].data_ptr(), made[3].data_ptr()]
    views = {}
    out = _replay._rebuilt(record.results, made, addresses, views)
    assert out[0] is made[2] and out[2] is x2 and out[3] is None
    assert out[1].data_ptr() == made[3].data_ptr() + 40 and out[1].shape == (10,)
    at = _replay._rebuilt(dict(record.attrs)["at"], made, addresses, views)
    assert at == (made[3].data_ptr() + 8, 99)


def test_a_body_that_runs_a_pytorch_op_or_returns_foreign_memory_is_not_recorded():
    """An op that is neither an allocation, a view nor one of the ops replayed as
    steps (an exp), an op of those on memory the call does not hold, or a result that
    lies in no buffer of the call, fails the recording and says why; so do two inputs
    over one tensor's memory."""
    x, other = torch.randn(8), torch.randn(8)
    rec = _replay.Recording((x,))
    with rec:
        torch.empty(8).exp_()
    assert rec.failed == "aten.exp_.default ran" and rec.record((), Ctx(), ()) is None

    rec = _replay.Recording((x,))
    with rec:
        other.zero_()
    assert rec.failed == "an op's operand in memory the call did not allocate"

    rec = _replay.Recording((x,))
    with rec:
        pass
    assert rec.record((torch.randn(3),), Ctx(), ()) is None
    assert rec.failed == "a result in memory the call did not allocate"

    assert _replay.Recording((x, x[2:])).failed == "inputs share memory"


def test_a_zero_fill_a_copy_and_a_cast_are_steps_between_the_launches():
    """A body's zero fill of a slice of an allocation, its copy of an input into the
    rest, and its cast of an input (a new tensor, then a copy into it) are recorded in
    their order among the launches; run on a second call's tensors, they do there what
    the body did."""
    n = random.randrange(4, 32)
    x = torch.randn(3, n)
    rec = _replay.Recording((x,))
    with rec:
        y = torch.empty(5, n)
        launch(rec, [y.data_ptr()])
        y[3:].zero_()
        y[:3].copy_(x)
        z = x.to(torch.float64)
    record = rec.record((y, z), Ctx(), ())
    assert record is not None, rec.failed
    assert [type(st).__name__ for st in record.steps] == ["Step", "Op", "Op", "Op"]
    assert [b[0] for b in record.buffers] == ["new", "new"]
    assert record.kernels == record.steps[:1]

    x2 = torch.randn(3, n)
    made = [x2, torch.full((5, n), float("nan")), torch.full((3, n), float("nan")).double()]
    addresses, views = [t.data_ptr() for t in made], {}
    for st in record.steps[1:]:
        st.run(made, addresses, views)
    assert torch.equal(made[1], torch.cat([x2, torch.zeros(2, n)]))
    assert torch.equal(made[2], x2.double())
    out = _replay._rebuilt(record.results, made, addresses, views)
    assert out[0] is made[1] and out[1] is made[2]


def test_a_sum_into_a_new_tensor_is_a_step_between_the_launches():
    """A body's sum of two tensors into one it allocates (a chain's gradients that
    meet, ``_chain``) is recorded as a step; run on a second call's tensors, it sums
    those."""
    n = random.randrange(4, 32)
    a, b = torch.randn(2, n), torch.randn(2, n)
    rec = _replay.Recording((a, b))
    with rec:
        d = torch.empty_like(a)
        launch(rec, [d.data_ptr()])
        total = torch.empty_like(a)
        torch.add(a, d, out=total)
    record = rec.record(total, Ctx(), ())
    assert record is not None, rec.failed
    assert [type(st).__name__ for st in record.steps] == ["Step", "Op"]

    made = [torch.randn(2, n), torch.randn(2, n), torch.randn(2, n), torch.empty(2, n)]
    addresses, views = [t.data_ptr() for t in made], {}
    record.steps[1].run(made, addresses, views)
    assert torch.equal(made[3], made[0] + made[2])
    assert _replay._rebuilt(record.results, made, addresses, views) is made[3]


def test_results_of_whole_buffers_and_of_constants_rebuild_in_one_step():
    """A tuple of whole buffers comes back as one lookup of them and a tuple of
    constants as itself, inside a tuple that holds both; the replay gives the second
    call's tensors in their places."""
    x = torch.randn(8)
    rec = _replay.Recording((x,))
    with rec:
        ys = [torch.empty(8) for _ in range(3)]
    results = (tuple(ys), ("relu", 3, None), (x, ys[0][2:]))
    record = rec.record(results, Ctx(), ())
    kinds = [t[0] for t in record.results[1]]
    assert record.results[0] == "tuple" and kinds == ["tensors", "same", "tuple"]
    made = [torch.randn(8)] + [torch.randn(8) for _ in range(3)]
    addresses, views = [t.data_ptr() for t in made], {}
    out = _replay._rebuilt(record.results, made, addresses, views)
    assert all(a is b for a, b in zip(out[0], made[1:])) and out[1] == ("relu", 3, None)
    assert out[2][0] is made[0] and out[2][1].data_ptr() == made[1].data_ptr() + 8


def test_a_replay_sets_only_the_arguments_whose_buffers_moved():
    """Binding a record's launches to a call's addresses marks the launches whose
    arguments change (their graph nodes are set again) and leaves the others as they
    were: the same addresses change nothing."""
    x, w = torch.randn(8), torch.randn(4)
    rec = _replay.Recording((x, w))
    with rec:
        y = torch.empty(8)
        launch(rec, [x.data_ptr(), y.data_ptr()])
        launch(rec, [w.data_ptr(), 5])
    record = rec.record(y, Ctx(), ())
    first, second = record.kernels
    addresses = [x.data_ptr(), w.data_ptr(), y.data_ptr()]
    record._bind(addresses)
    first.dirty = second.dirty = False
    record._bind(list(addresses))
    assert not first.dirty and not second.dirty
    moved = addresses[:2] + [addresses[2] + 4096]
    record._bind(moved)
    assert first.dirty and not second.dirty
    assert list(first.slots) == [x.data_ptr(), addresses[2] + 4096]
    assert list(second.slots) == [w.data_ptr(), 5]


def test_the_launches_between_ops_go_out_as_runs_in_their_order():
    """A record's steps split into runs of launches (each one graph where the driver
    builds it) and the ops between them, in the body's order."""
    x = torch.randn(8)
    rec = _replay.Recording((x,))
    with rec:
        y = torch.empty(8)
        launch(rec, [y.data_ptr()])
        launch(rec, [x.data_ptr()])
        y.zero_()
        launch(rec, [y.data_ptr(), 7])
    record = rec.record((y,), Ctx(), ())
    a, b, op, c = record.steps
    assert [steps for _, steps in _replay._runs(record.steps)] == [[a, b], [op], [c]]


def test_a_key_that_fails_is_tried_again_then_run_as_usual(monkeypatch):
    """Each call of a key whose body cannot be recorded runs the body; after TRIES
    failures it is no longer watched, and its entry says why."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_replay, "ENABLED", True)
    x = torch.randn(16)
    records, calls = {}, []

    def body():
        calls.append(1)
        return torch.empty(16).fill_(0.0).exp_()

    for _ in range(_replay.TRIES + 2):
        out, record = _replay.run(Ctx(), records, "key", (x,), body, ())
        assert record is None and torch.equal(out, torch.ones(16))
    assert len(calls) == _replay.TRIES + 2
    assert records["key"].count == _replay.TRIES and records["key"].why.endswith(" ran")


def test_a_node_called_inside_a_body_being_recorded_runs_as_usual(monkeypatch):
    """A node's call inside another's recorded body neither records nor replays: its
    launches are the outer body's, which its own record would hide from the outer
    recording."""
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(_replay, "ENABLED", True)
    x, inner = torch.randn(16), {}

    def body():
        out, record = _replay.run(Ctx(), inner, "inner", (x,), lambda: torch.empty(4), ())
        assert record is None
        return out

    out, record = _replay.run(Ctx(), {}, "outer", (x,), body, ())
    assert record is not None and inner == {}


def test_allocations_only_launches_touch_share_one_allocation():
    """A body's allocations that no result, ctx attribute or op reads (only its launches
    write and read them) are placed in one allocation of bytes, each at a multiple of
    ``ARENA_ALIGN`` and none over another; a result, an attribute, an op's operand, a
    view's buffer and an allocation past ``ARENA_MOST`` bytes each keep their own."""
    x = torch.randn(8)
    sizes = [random.randrange(1, 300) for _ in range(3)]
    rec = _replay.Recording((x,))
    with rec:
        inner = [torch.empty(n) for n in sizes]  # only launched
        y, kept, summed, viewed = (torch.empty(8) for _ in range(4))
        large = torch.empty(_replay.ARENA_MOST // 4 + 1)
        torch.add(x, summed, out=summed)
        launch(rec, [t.data_ptr() for t in (*inner, y, kept, summed, viewed, large)])
    ctx = Ctx()
    ctx.kept = kept
    record = rec.record((y, viewed[2:]), ctx, ("kept",))
    kinds = [kind for kind, _ in record.specs]
    assert kinds == ["arena"] * 3 + ["new"] * 5
    offsets = [spec[0] for kind, spec in record.specs if kind == "arena"]
    assert all(at % _replay.ARENA_ALIGN == 0 for at in offsets)
    ends = [at + 4 * n for at, n in zip(offsets, sizes)]
    assert all(end <= following for end, following in zip(ends, offsets[1:]))
    assert ends[-1] <= record.arena < ends[-1] + _replay.ARENA_ALIGN
    assert [spec[1][0] for kind, spec in record.specs if kind == "arena"] == [(n,) for n in sizes]


def test_a_tuple_of_constants_and_buffers_rebuilds_in_one_step():
    """A result that mixes constants and whole buffers (a chain's ctx attributes of a
    pair) is rebuilt as the constants with the second call's tensors in their places."""
    x = torch.randn(8)
    rec = _replay.Recording((x,))
    with rec:
        y = torch.empty(8)
    record = rec.record((("relu", y, None, x, 3),), Ctx(), ())
    (part,) = record.results[1]
    assert part[0] == "mixed"
    made = [torch.randn(8), torch.randn(8)]
    out = _replay._rebuilt(record.results, made, [t.data_ptr() for t in made], {})
    assert out == (("relu", made[1], None, made[0], 3),)
    assert out[0][1] is made[1] and out[0][3] is made[0]
