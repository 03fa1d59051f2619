"""A node's host work recorded once and replayed: its allocations and its launches.

An eager step of a network of small layers waits on the host, and most of a
specgen node's host time is Python that works out, call after call, the same
allocations and the same launches: which kernels, which scratch, which address goes
in which argument.  For calls that agree in everything that Python decides on (the
node's ``key``: its layer, batch, dtypes, which gradients are wanted), the first call
runs the node's body as usual while ``Recording`` watches it: every tensor the body
allocates or views (a ``TorchDispatchMode``), every launch with its argument slots
(``runtime.Launcher`` and ``_engine.launch_steps`` report them), the scratch it takes
(``_engine.workspace``), and the few PyTorch ops it may run on those tensors (a zero
fill, a copy, a cast, a sum: ``IN_PLACE``, ``COPIES``).  Each argument is then either an
address inside one of the call's tensors (an input, an allocation, the scratch; kept
as that tensor and an offset) or a constant.  Later calls allocate the same tensors
(those that only the launches read, in the stream's scratch: ``ARENA``), write their
addresses into the slots and launch: the same launches, and the same ops
between them, on the same current stream, with no Python in between; each run of
launches goes out as one CUDA graph (``Graph``).  The convolution's node
(``_ops.Conv2dFunction``), the batch norm's (``_batchnorm.BatchNormFunction``) and the
two as one (``_convnorm``) go through ``forward`` and ``backward`` here.

A body that does anything else (another PyTorch op, an op on memory the call does
not hold, a ``__constant__`` upload) cannot be replayed: its recording fails, and
after ``TRIES`` failures the key is run as usual for good.  The first call of a layer
fails so while it builds its kernels; the second records.  Nothing is recorded or
replayed while a CUDA graph is captured (the scratch differs there), for inputs off
a 16-byte boundary (the body copies them), or where ``ENABLED`` is off
(``SPECGEN_REPLAY=0``; the tests compare the two)."""

from __future__ import annotations

import ctypes
import os
import threading
from functools import partial
from operator import itemgetter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..runtime import RECORDING, _driver_launch, recording
from ._engine import on_device, raw_stream, workspace

ENABLED = os.environ.get("SPECGEN_REPLAY", "1") != "0"
GRAPHED = True  # a replay launches each run of its kernels as one CUDA graph (``Graph``)
TRIES = 3  # failed recordings of a key before it is run as usual for good
KEPT = 4096  # records kept (a stream of new shapes: start over)
ALIGNED = 16
# A replay's allocations that no result, ctx attribute or op reads (only its launches
# write and read them: a chain's gradients between its pairs, a backward's dy) lie in
# the stream's scratch (``_engine.workspace``) past the scratch the body took, each at
# a multiple of ``ARENA_ALIGN`` bytes as the caching allocator places its own: no call
# to the allocator for them, and the same addresses replay after replay (no graph node
# set again).  A stream runs its launches in order, so whatever next uses the scratch
# comes after this call's last launch, which is the last to read them.  Up to
# ``ARENA_MOST`` bytes in all; past it a buffer keeps an allocation of its own, as each
# does with ``ARENA`` off (the tests compare the two).
ARENA = True
ARENA_MOST = 1 << 26
ARENA_ALIGN = 512

_aten = torch.ops.aten
ALLOCATIONS = {_aten.empty.memory_format, _aten.empty_strided.default, _aten.empty_like.default}
# PyTorch ops that a body may run on the call's tensors (a chain's sums of gradients,
# ``_chain``, among them): each is replayed as a step between the launches; an op that
# makes a tensor as a copy of another (a cast, a clone) as an allocation and then a
# copy into it.
IN_PLACE = {_aten.zero_.default, _aten.copy_.default, _aten.fill_.Scalar, _aten.add.out}
COPIES = {_aten._to_copy.default, _aten.clone.default}
VIEWS = {
    _aten.slice.Tensor,
    _aten.as_strided.default,
    _aten.view.default,
    _aten.alias.default,
    _aten.detach.default,
}


class Step:
    """One recorded launch: its function, grid, block and shared bytes, argument slots
    of its own with the constants in place, and the slots (and tensor maps) that take
    a tensor's address plus an offset at each replay."""

    def __init__(self, head: tuple, values: list, fill: list, maps: list):
        self.head = head
        self.slots = (ctypes.c_uint64 * len(values))(*values)
        base = ctypes.addressof(self.slots)
        self.params = (ctypes.c_void_p * len(values))(*(base + 8 * i for i in range(len(values))))
        self.params_at = ctypes.addressof(self.params)
        self.fill = fill  # (slot, buffer, byte offset)
        self.maps = maps  # (parameter, tma.BoundMap, buffer, byte offset)
        # the buffers of the maps its parameters point to, held until the next replay:
        # the driver reads them when a graph's node is set, after every step is bound,
        # and steps of one record may share a map (two layers of one problem), which
        # lets go of its oldest addresses as it meets new ones
        self.held: list = [None] * len(maps)
        self.mapped: list = [None] * len(maps)  # the device address each map was bound to
        self.dirty = True  # its arguments changed since its graph's node was last set


class Op:
    """A PyTorch op the body ran between its launches, on tensors of the call (each
    argument a template of ``Recording._template``'s)."""

    def __init__(self, func, args: tuple, kwargs: dict):
        self.func, self.args, self.kwargs = func, args, kwargs

    def run(self, made: list, addresses: list, views: dict) -> None:
        args = [_rebuilt(a, made, addresses, views) for a in self.args]
        kwargs = {k: _rebuilt(v, made, addresses, views) for k, v in self.kwargs.items()}
        self.func(*args, **kwargs)


class Record:
    """What a node's call did, to do again: the buffers by index (the inputs first,
    then each allocation and scratch in the order the body took them), the launches,
    and how to rebuild its results and ctx attributes from the buffers.

    Its launches go out as CUDA graphs (``Graph``), one for each run of them between
    ops: each replay writes the addresses that changed into a graph's kernel nodes and
    launches it, a fraction of the driver's time for the launches one by one.  Where the driver
    will not build a graph, or ``GRAPHED`` is off, they go one by one."""

    def __init__(self, index, buffers, steps, results, attrs, read, inputs: int):
        self.index, self.buffers, self.steps = index, buffers, steps
        self.results, self.attrs = results, attrs
        self.lock = threading.Lock()  # the slots are the record's own, shared by calls
        self.replays = 0
        self.kernels = [st for st in steps if type(st) is Step]
        self.runs: list | None = None  # its launches as graphs, from the first replay
        self.graphed = 0  # graphs launched
        self.after: dict = {}  # records of the next node's calls (a forward's backward)
        self.scratch_need = max((b[1] for b in buffers if b[0] == "scratch"), default=0)
        # each buffer's allocation: ("new", allocate's arguments), ("arena", (its byte
        # offset past the scratch, where those only launches touch lie (``ARENA``),
        # allocate's arguments where ``ARENA`` is off)) or ("scratch", ...); ``read``:
        # the buffers (by index, the inputs first) that a result, a ctx attribute or an
        # op reads
        self.specs, self.arena = _placed(buffers, read, inputs)
        self.arena_device = next((b[4] for b in buffers if b[0] == "new"), None)
        self.bound: list | None = None  # the addresses its slots and maps were last set to

    def replay(self, ctx, inputs: tuple, addresses: list):
        """The results of the recorded call for these ``inputs`` (at ``addresses``; the
        recorded call's dtypes, sizes and strides), its ctx attributes set on ``ctx``.
        Every scratch the body took is the stream's scratch at the most it took: the
        launches run in the stream's order, as they share it in the body."""
        self.replays += 1
        index = self.index
        stream = raw_stream(index)
        made = list(inputs)
        addresses = list(addresses)
        keep = []
        scratch = None
        base = None
        if self.arena and ARENA:  # the scratch, then the buffers only launches touch
            start = -(-self.scratch_need // ARENA_ALIGN) * ARENA_ALIGN
            scratch = workspace(start + self.arena, self.arena_device, stream, keep)
            base = arena_at(scratch, start, self.arena, stream)
        for kind, spec in self.specs:
            if kind == "arena" and base is not None:
                made.append(None)  # no tensor: only its launches' slots read it
                addresses.append(base + spec[0])
            elif kind != "scratch":
                t = allocate(*spec if kind == "new" else spec[1])
                made.append(t)
                addresses.append(t.data_ptr())
            else:
                if scratch is None:
                    scratch = workspace(self.scratch_need, spec[1], stream, keep)
                made.append(None)
                addresses.append(scratch)
        views: dict = {}
        on_device(index, self._launch, made, addresses, views, stream)
        for name, value in self.attrs:
            setattr(ctx, name, _rebuilt(value, made, addresses, views))
        return _rebuilt(self.results, made, addresses, views)

    def _launch(self, made: list, addresses: list, views: dict, stream: int) -> None:
        with self.lock:
            if addresses != self.bound:
                self._bind(addresses)
                self.bound = addresses
            if not GRAPHED:
                self._one_by_one(self.steps, made, addresses, views, stream)
                return
            if self.runs is None:
                self.runs = _runs(self.steps)
            for run in self.runs:
                graph, steps = run
                if graph is not None and graph.launch(stream):
                    self.graphed += 1
                    continue
                run[0] = None  # never built, or the driver refused it: one by one
                self._one_by_one(steps, made, addresses, views, stream)

    def _bind(self, addresses: list) -> None:
        """Each launch's slots and tensor maps set for the buffers at ``addresses``; a
        step whose arguments change is marked for its graph's node to be set
        (``Graph.launch``).  A training loop's calls mostly meet the addresses of the
        call before (the caching allocator's reuse), and then nothing is set."""
        for st in self.kernels:
            slots, dirty = st.slots, st.dirty
            for i, b, offset in st.fill:
                at = addresses[b] + offset
                if slots[i] != at:
                    slots[i], dirty = at, True
            for j, (i, bound, b, offset) in enumerate(st.maps):
                at = addresses[b] + offset
                if st.mapped[j] != at:
                    st.held[j], st.params[i] = bound.encoding(at)
                    st.mapped[j], dirty = at, True
            st.dirty = dirty

    @staticmethod
    def _one_by_one(steps, made, addresses, views, stream) -> None:
        launch = _driver_launch()
        for st in steps:
            if type(st) is Op:
                st.run(made, addresses, views)
            else:
                launch(*st.head, stream, st.params_at, 0)


def _placed(buffers: list, read, inputs: int) -> tuple[list, int]:
    """Each buffer's allocation in a replay (``Record.specs``) and the bytes past the
    scratch for those no result, attribute or op reads (``read``: by index, ``inputs``
    first), ``ARENA_MOST`` in all; 0 where there are none."""
    specs, arena = [], 0
    for b, (kind, *spec) in enumerate(buffers, inputs):
        if kind == "new" and b not in read:
            size, stride, dtype = spec[:3]
            extent = 1 + sum((n - 1) * s for n, s in zip(size, stride)) if all(size) else 0
            nbytes = -(-max(extent * dtype.itemsize, 1) // ARENA_ALIGN) * ARENA_ALIGN
            if arena + nbytes <= ARENA_MOST:
                specs.append(("arena", (arena, tuple(spec))))
                arena += nbytes
                continue
        specs.append((kind, tuple(spec)))
    return specs, arena


def _runs(steps: list) -> list:
    """[graph, steps] for each run of launches among ``steps`` (``Graph``; None where
    the driver will not build it), and [None, [op]] for each op between them."""
    runs, kernels = [], []
    for st in steps + [None]:
        if type(st) is Step:
            kernels.append(st)
            continue
        if kernels:
            runs.append([Graph.of(kernels), kernels])
            kernels = []
        if st is not None:
            runs.append([None, [st]])
    return runs


class _NodeParams(ctypes.Structure):
    """The driver's CUDA_KERNEL_NODE_PARAMS_v2: a kernel node's launch."""

    _fields_ = [
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("params", ctypes.c_void_p),
        ("extra", ctypes.c_void_p),
        ("kern", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
    ]


class Graph:
    """A record's launches as a CUDA graph of kernel nodes, each after the one before,
    on the current device.  ``launch`` sets the arguments of each node whose step's
    argument slots changed since it last set them (the driver copies them) and launches
    the graph on a stream: one driver call for each node set, one for all the launches
    (``docs/measurements/launch-cost-*``).  The caching allocator hands a training
    loop's calls the same memory, call after call, so most replays set few nodes.  A launch of it still under way keeps the
    arguments it was launched with, and the next waits for it (the driver orders the
    launches of one graph)."""

    def __init__(self, graph: int, executable: int, nodes: list, steps: list):
        self.graph, self.executable = graph, executable
        self.nodes = nodes  # (node, its params, a reference to them)
        self.steps = steps  # each node's step
        cuda, runtime = _cuda(), _runtime()
        self.set = cuda.cuGraphExecKernelNodeSetParams_v2
        self.enqueue = partial(runtime.graphLaunch, executable)

    @classmethod
    def of(cls, steps: list) -> Graph | None:
        """The graph of ``steps``; None where the driver will not build it."""
        cuda, runtime = _cuda(), _runtime()
        if cuda is None:
            return None
        graph = ctypes.c_void_p()
        if cuda.cuGraphCreate(ctypes.byref(graph), 0):
            return None
        nodes, before = [], None
        for st in steps:
            params = _NodeParams(st.head[0], st.head[1:4], st.head[4:7], st.head[7], st.params_at)
            node = ctypes.c_void_p()
            deps = None if before is None else ctypes.byref(before)
            made = cuda.cuGraphAddKernelNode_v2(
                ctypes.byref(node), graph, deps, 0 if before is None else 1, ctypes.byref(params)
            )
            if made:
                runtime.graphDestroy(graph.value)
                return None
            nodes.append((node, params, ctypes.byref(params)))
            before = node
        try:
            executable = runtime.graphInstantiate(graph.value)
        except _errors():
            runtime.graphDestroy(graph.value)
            return None
        return cls(graph.value, executable, nodes, steps)

    def launch(self, stream: int) -> bool:
        """Whether the graph went out (else the driver refused a node's arguments).
        Only the nodes whose step's arguments changed (``Step.dirty``) are set: the
        graph keeps the others' from their last setting."""
        set_params, executable = self.set, self.executable
        for st, (node, _, params) in zip(self.steps, self.nodes):
            if st.dirty:
                if set_params(executable, node, params):
                    return False
                st.dirty = False
        self.enqueue(stream)
        return True

    def __del__(self):
        try:
            runtime = _runtime()
            runtime.graphExecDestroy(self.executable)
            runtime.graphDestroy(self.graph)
        except Exception:  # the process is ending, and CUDA (or CuPy) with it
            pass


_libcuda: list = []  # the driver library, once loaded (None where it cannot be)


def _cuda():
    """The CUDA driver's library through ctypes, its graph functions typed; None where
    it cannot be loaded or lacks them (a driver older than CUDA 12's)."""
    if not _libcuda:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            p = ctypes.c_void_p
            lib.cuGraphCreate.argtypes = [ctypes.POINTER(p), ctypes.c_uint]
            lib.cuGraphAddKernelNode_v2.argtypes = [
                ctypes.POINTER(p),
                p,
                ctypes.POINTER(p),
                ctypes.c_size_t,
                ctypes.POINTER(_NodeParams),
            ]
            lib.cuGraphExecKernelNodeSetParams_v2.argtypes = [p, p, ctypes.POINTER(_NodeParams)]
        except (OSError, AttributeError):
            lib = None
        _libcuda.append(lib)
    return _libcuda[0]


def _runtime():
    from cupy.cuda import runtime

    return runtime


def _errors() -> tuple:
    from cupy.cuda import runtime

    return (runtime.CUDARuntimeError,)


def arena_at(scratch: int, start: int, nbytes: int, stream: int) -> int:
    """Where a replay's buffers that only its launches touch begin: ``start`` bytes into
    the stream's scratch at ``scratch`` (the tests poison their ``nbytes``)."""
    return scratch + start


def allocate(size, stride, dtype, device) -> torch.Tensor:
    """A replay's allocation of a tensor the body allocated (the tests poison it)."""
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


class Refused:
    """A key whose recordings failed: how many times, and why the last did."""

    def __init__(self, count: int, why: str):
        self.count, self.why = count, why


def _rebuilt(value, made: list, addresses: list, views: dict):
    """A recorded result (``Recording._template``) for this replay's buffers."""
    kind = value[0]
    if kind == "same":
        return value[1]
    if kind == "tensor":
        return made[value[1]]
    if kind == "view":
        key = value[1:]
        t = views.get(key)
        if t is None:
            b, offset, size, stride = key
            base = made[b]
            t = views[key] = base.as_strided(size, stride, base.storage_offset() + offset)
        return t
    if kind == "address":
        return addresses[value[1]] + value[2]
    if kind == "tensors":
        return value[1](made)
    if kind == "mixed":
        out = list(value[1])
        for at, b in value[2]:
            out[at] = made[b]
        return tuple(out)
    return tuple(_rebuilt(v, made, addresses, views) for v in value[1])  # "tuple"


class Recording(TorchDispatchMode):
    """Watches one call of a node's body (``run``): every tensor it allocates, every
    launch, the scratch it takes, each op of ``IN_PLACE`` and ``COPIES`` (kept as a
    step); any other PyTorch op but a view sets ``failed`` (why the call cannot be
    replayed).  Tensors are told apart by where they lie: a result,
    a ctx attribute or a launch's argument is an address in one of the call's buffers
    (which are all held to the end, so that none is reused), else a constant."""

    def __init__(self, inputs: tuple):
        super().__init__()
        self.failed = ""
        self.inputs = inputs
        self.buffers: list = []  # (kind, ...) of each buffer past the inputs
        self.spans: list = [_span(t) for t in inputs]  # [first byte, end) of each buffer
        self.keep: list = []  # the buffers, held
        self.steps: list = []
        self.index = next(t for t in inputs if t is not None).get_device()
        if _overlapping(self.spans):
            self.failed = "inputs share memory"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in ALLOCATIONS:
            self._new(out)
        elif func in COPIES and out.device == args[0].device:  # a new tensor, copied into
            self._new(out)
            self._op(_aten.copy_.default, (out, args[0]), {})
        elif func in IN_PLACE:
            self._op(func, args, kwargs)
        elif func not in VIEWS and not self.failed:
            self.failed = f"{func} ran"
        return out

    def _new(self, t: torch.Tensor) -> None:
        self.buffers.append(("new", tuple(t.shape), t.stride(), t.dtype, t.device))
        self.spans.append(_span(t))
        self.keep.append(t)

    def _op(self, func, args: tuple, kwargs: dict) -> None:
        """PyTorch op ``func`` ran on tensors in the call's buffers: a step of its own."""
        operands = tuple(self._operand(a) for a in args)
        named = {k: self._operand(v) for k, v in kwargs.items()}
        self.steps.append(Op(func, operands, named))

    def _operand(self, v):
        return self._tensor(v, "an op's operand") if isinstance(v, torch.Tensor) else ("same", v)

    def scratch(self, t: torch.Tensor, need: int, device) -> None:
        """The body took ``need`` bytes of the stream's scratch, tensor ``t``."""
        at = t.data_ptr()
        n = len(self.spans) - len(self.buffers)  # the inputs
        for b in range(n, len(self.spans)):
            if self.spans[b][0] == at and self.buffers[b - n][0] == "new":
                self.buffers[b - n] = ("scratch", need, device)  # allocated just now
                return
        self.buffers.append(("scratch", need, device))
        self.spans.append((at, at + need))
        self.keep.append(t)

    def launched(self, st, maps: list) -> None:
        """Launch ``st`` (a ``runtime._Step``) with its slots filled, and its tensor maps
        encoded for (parameter, BoundMap, address)."""
        values = list(st.slots)
        fill = []
        for i, v in enumerate(values):
            b = self._address(v)
            if b is not None:
                fill.append((i, b, v - self.spans[b][0]))
        bound = []
        for i, m, address in maps:
            b = self._address(address)
            if b is None:
                self.failed = self.failed or "a tensor map over memory the call does not hold"
                return
            bound.append((i, m, b, address - self.spans[b][0]))
        self.steps.append(Step(st.head, values, fill, bound))

    def _address(self, v: int):
        """The buffer that address ``v`` lies in, or None (a constant)."""
        for b, (first, end) in enumerate(self.spans):
            if first <= v < end:
                return b
        return None

    def _kind(self, b: int) -> str:
        n = len(self.spans) - len(self.buffers)
        return "input" if b < n else self.buffers[b - n][0]

    def _template(self, value):
        """How to rebuild ``value`` (a result or a ctx attribute) from a replay's buffers."""
        if isinstance(value, torch.Tensor):
            return self._tensor(value)
        if isinstance(value, tuple):
            return ("tuple", tuple(self._template(v) for v in value))
        if isinstance(value, int) and not isinstance(value, bool):
            b = self._address(value)
            if b is not None:
                return ("address", b, value - self.spans[b][0])
        return ("same", value)

    def _tensor(self, t: torch.Tensor, what: str = "a result"):
        for b, given in enumerate(self.inputs):
            if t is given:
                return ("tensor", b)
        b = self._address(t.data_ptr()) if t.numel() else None
        kind = None if b is None else self._kind(b)
        if kind is None or kind == "scratch":
            self.failed = self.failed or f"{what} in memory the call did not allocate"
            return ("same", None)
        base = self.inputs[b] if kind == "input" else self.buffers[b - len(self.inputs)]
        if kind == "new" and t.data_ptr() == self.spans[b][0]:
            if (tuple(t.shape), t.stride(), t.dtype) == base[1:4]:
                return ("tensor", b)
        dtype = base.dtype if kind == "input" else base[3]
        offset, rest = divmod(t.data_ptr() - self.spans[b][0], t.element_size())
        if rest or t.dtype is not dtype:
            self.failed = self.failed or f"{what} that views its buffer as another dtype"
            return ("same", None)
        return ("view", b, offset, tuple(t.shape), t.stride())

    def record(self, results, ctx, names: tuple) -> Record | None:
        attrs = [(n, self._template(getattr(ctx, n))) for n in names if hasattr(ctx, n)]
        template = self._template(results)
        if self.failed:
            return None
        read: set = set()
        for t in [template, *(a for _, a in attrs)]:
            _read(t, read)
        for op in self.steps:
            if type(op) is Op:
                for t in (*op.args, *op.kwargs.values()):
                    _read(t, read)
        attrs = [(n, _folded(a)) for n, a in attrs]
        inputs = len(self.inputs)
        return Record(self.index, self.buffers, self.steps, _folded(template), attrs, read, inputs)


def _read(template, into: set) -> None:
    """The buffers that a template (``Recording._template``) rebuilds from, added to
    ``into``: a tensor, a view of one, an address in one."""
    kind = template[0]
    if kind in ("tensor", "view", "address"):
        into.add(template[1])
    elif kind == "tuple":
        for t in template[1]:
            _read(t, into)


def _folded(template):
    """``template`` with each tuple of constants one constant, each tuple of two or
    more whole buffers one lookup of them, and each tuple of both the constants with
    the buffers put in their places: each rebuilt in one step."""
    if template[0] != "tuple":
        return template
    parts = tuple(_folded(v) for v in template[1])
    if all(p[0] == "same" for p in parts):
        return ("same", tuple(p[1] for p in parts))
    if len(parts) > 1 and all(p[0] == "tensor" for p in parts):
        return ("tensors", itemgetter(*(p[1] for p in parts)))
    if all(p[0] in ("same", "tensor") for p in parts):
        constants = tuple(p[1] if p[0] == "same" else None for p in parts)
        places = tuple((at, p[1]) for at, p in enumerate(parts) if p[0] == "tensor")
        return ("mixed", constants, places)
    return ("tuple", parts)


def _span(t) -> tuple[int, int]:
    """The bytes tensor ``t`` covers, [first, end); empty for None or no elements."""
    if t is None or t.numel() == 0:
        return (0, 0)
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return (t.data_ptr(), t.data_ptr() + extent * t.element_size())


def _overlapping(spans: list) -> bool:
    spans = sorted(s for s in spans if s[1] > s[0])
    return any(a[1] > b[0] for a, b in zip(spans, spans[1:]))


def run(ctx, records: dict, key, inputs: tuple, body, names: tuple):
    """``body()``'s results and the record they followed (or None): by replaying the
    record of ``key`` where there is one (its ctx attributes ``names`` set as the body
    sets them), else by running the body, and recording it where it may be replayed
    (module docstring)."""
    addresses = [0 if t is None else t.data_ptr() for t in inputs]
    if not ENABLED or any(a % ALIGNED for a in addresses):
        return body(), None
    if torch.cuda.is_current_stream_capturing() or recording():
        return body(), None  # captured, or inside a body being recorded: as usual
    found = records.get(key)
    if isinstance(found, Record):
        return found.replay(ctx, inputs, addresses), found
    tries = 0 if found is None else found.count
    if tries >= TRIES:
        return body(), None
    rec = Recording(inputs)
    RECORDING.rec = rec
    try:
        with rec:
            results = body()
    finally:
        RECORDING.rec = None
    made = None if rec.failed else rec.record(results, ctx, names)
    if len(records) >= KEPT:
        records.clear()
    records[key] = made if made is not None else Refused(tries + 1, rec.failed)
    return results, made


def forward(ctx, records: dict, key, inputs: tuple, body, names: tuple):
    """A node's forward through ``run``, the record it followed kept on ``ctx`` for its
    backward (``backward``)."""
    results, ctx.record = run(ctx, records, key, inputs, body, names)
    return results


def backward(ctx, key, inputs: tuple, body):
    """A node's backward through ``run``, among the records that follow its forward's
    record; its body as usual where the forward followed none."""
    if ctx.record is None:
        return body()
    return run(ctx, ctx.record.after, key, inputs, body, ())[0]
