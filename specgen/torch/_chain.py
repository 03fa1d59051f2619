"""A network's stages of residual blocks as one autograd node (``run_chain``): every
convolution and batch norm pair of the blocks, in the order the blocks' own forwards
run them, with the same kernels, values, gradients and running statistics, bit for bit.

A training step of a network of small layers waits on the host, and each pair's node
(``_convnorm``) still costs it an ``apply``, a turn in the autograd engine and a replay
each way.  One node for all of ResNet's blocks costs one of each: its forward replays
one record of every pair's launches, its backward another (``_replay``), and it saves
the blocks' intermediate tensors itself.

A block joins a chain where its class says how its pairs feed each other
(``chain_steps``: torchvision's ``BasicBlock`` and ``Bottleneck`` in their fused forms,
``_torchvision``).  The first call of a chain, and any call that reads otherwise than
the last (x's sizes, strides or dtype, autocast, tf32, a module's arguments, a
parameter or buffer replaced), runs the blocks' forwards as they are, each pair one node,
and notes what each pair's node was handed (``_convnorm.collected``).  Where every pair
ran as a node, later calls that read the same run the chain's node with the same.
Hooks, eval mode, a module of another class or a call being compiled: the blocks'
forwards, always.  ``SPECGEN_CHAIN=0`` (or ``ENABLED`` off) turns chains off."""

from __future__ import annotations

import os
import weakref
from functools import partial

import torch
import torch.nn.functional as F

from . import _batchnorm as B
from . import _convnorm as C
from . import _engine, _replay
from ._ops import _apply_of

ENABLED = os.environ.get("SPECGEN_CHAIN", "1") != "0"
PER_PAIR = 6  # tensors a pair hands its node after x: w, b, gamma, beta, mean, var


class PairStep:
    """One pair of a chain: its modules, the value its convolution reads (0 the chain's
    input, k + 1 step k's output) and the value its batch norm adds, or None."""

    __slots__ = ("conv", "bn", "src", "res")

    def __init__(self, conv, bn, src: int, res: int | None):
        self.conv, self.bn, self.src, self.res = conv, bn, src, res


def program(stages) -> list[PairStep] | None:
    """The steps of ``stages`` (``nn.Sequential`` modules of blocks, applied in turn),
    each block's (``chain_steps``, in its values: 0 its input, k + 1 its step k's
    output) renumbered into the chain's; None where a stage or block cannot join."""
    steps: list[PairStep] = []
    modules = []
    for stage in stages:
        if type(stage) is not torch.nn.Sequential:
            return None
        modules.append(stage)
        for block in stage._modules.values():
            local = getattr(block, "chain_steps", None)
            found = local() if local is not None else None
            if not found:
                return None
            base = len(steps)  # the block's input is the chain's value ``base``
            for conv, bn, src, res in found:  # the block's value v is the chain's base + v
                steps.append(PairStep(conv, bn, base + src, None if res is None else base + res))
            modules.append(block)
    for st in steps:
        modules += (st.conv, st.bn)
    return steps if C._bare(*modules) else None


class Chain:
    """What a chain's node runs: its steps' values (``PairStep.src``, ``PairStep.res``) and each
    pair's last argument (``_convnorm``'s: the layer and the batch norm's call), and
    the records of its replays (``_replay``), by which gradients are wanted."""

    def __init__(self, steps: list[PairStep], calls: list):
        self.src = tuple(st.src for st in steps)
        self.res = tuple(st.res for st in steps)
        self.calls = tuple(calls)
        self.records: dict = {}
        self.wanted: dict = {}  # ``needs`` by the chain's needs_input_grad

    def needs(self, wanted: tuple) -> list[tuple]:
        """Each pair's ``needs_input_grad`` as its own node would see it, from the
        chain's (x, then each pair's six tensors): a value wants its gradient where
        anything it is computed from does.  Worked out once for each ``wanted``."""
        found = self.wanted.get(wanted)
        if found is None:
            found = self.wanted[wanted] = self._needs(wanted)
        return found

    def _needs(self, wanted: tuple) -> list[tuple]:
        flows = [wanted[0]]
        found = []
        for k, (src, res) in enumerate(zip(self.src, self.res)):
            w = wanted[1 + PER_PAIR * k : 1 + PER_PAIR * (k + 1)]
            r = res is not None and flows[res]
            needs = (flows[src], *w[:4], False, False, r, False)
            found.append(needs)
            flows.append(any(needs))
        return found


class Part:
    """A pair's share of the chain's ctx: what its forward sets (``_convnorm.SET``) and
    its ``needs_input_grad``, as its own node's ctx would hold them."""


class ChainFunction(torch.autograd.Function):
    """The chain's output from x and every pair's tensors (``PER_PAIR`` each, in step
    order); the last argument is the ``Chain``."""

    @staticmethod
    def forward(ctx, x, *args):
        *tensors, chain = args
        parts = []
        for needs in chain.needs(ctx.needs_input_grad):
            part = Part()
            part.needs_input_grad = needs
            parts.append(part)
        inputs = (x, *tensors)
        body = partial(_forward, parts, chain, inputs)
        (values, ys, attrs), ctx.record = _replay.run(
            ctx, chain.records, ctx.needs_input_grad, inputs, body, ()
        )
        for part, found in zip(parts, attrs):
            part.__dict__.update(zip(C.SET, found))
        ctx.parts, ctx.chain = parts, chain
        ctx.save_for_backward(x, *tensors, *values, *ys)
        return values[-1]

    @staticmethod
    def backward(ctx, dout):
        saved, chain, parts = ctx.saved_tensors, ctx.chain, ctx.parts
        n = len(chain.calls)
        x, tensors = saved[0], saved[1 : 1 + PER_PAIR * n]
        values = (x, *saved[1 + PER_PAIR * n : 1 + (PER_PAIR + 1) * n])
        ys = saved[1 + (PER_PAIR + 1) * n :]
        if torch.is_grad_enabled():  # create_graph: gradients that differentiate again
            grads = _differentiable(ctx, chain, tensors, values, dout)
            return (*grads, None)
        held = [dout, *saved]
        for p in parts:
            held += (p.scratch, getattr(p, "packed", None))
        inputs = tuple({id(t): t for t in held}.values())  # each tensor once (None too)
        body = partial(_backward, parts, chain, tensors, values, ys, dout)
        grads = _replay.backward(ctx, (dout.stride(), dout.dtype), inputs, body)
        return (*grads, None)


def _forward(parts, chain, inputs):
    """Every pair's forward (``_convnorm._forward``) in turn: the values after x, each
    convolution's output y (its batch norm's backward reads it), and what each pair's
    forward set on its part."""
    x, *tensors = inputs
    values, ys, attrs = [x], [], []
    for k, part in enumerate(parts):
        t = tensors[PER_PAIR * k : PER_PAIR * (k + 1)]
        src, res = chain.src[k], chain.res[k]
        r = None if res is None else values[res]
        out, saved = C._forward(part, values[src], *t, r, chain.calls[k])
        values.append(out)
        ys.append(saved[0])
        attrs.append(tuple(getattr(part, name, None) for name in C.SET))
    return tuple(values[1:]), tuple(ys), tuple(attrs)


def _backward(parts, chain, tensors, values, ys, dout):
    """Every pair's backward (``_convnorm._backward``) from the last to the first, each
    value's gradient summed over the pairs that read it: x's, then each pair's six."""
    n = len(parts)
    grads = [None] * (n + 1)  # by value
    grads[n] = dout
    found = [None] * (PER_PAIR * n)
    for k in reversed(range(n)):
        part, g = parts[k], grads[k + 1]
        if g is None or not any(part.needs_input_grad):
            continue
        weight, _, gamma = tensors[PER_PAIR * k : PER_PAIR * k + 3]
        out = values[k + 1] if part.kernels.act else None
        dx, dw, db, dgamma, dbeta, _, _, dr, _ = C._backward(
            part, values[chain.src[k]], weight, ys[k], gamma, out, g
        )
        found[PER_PAIR * k : PER_PAIR * k + 4] = (dw, db, dgamma, dbeta)
        _add(grads, chain.src[k], dx)
        if chain.res[k] is not None:
            _add(grads, chain.res[k], dr)
    return (grads[0], *found)


def _add(grads: list, v: int, g) -> None:
    """Gradient ``g`` added to value ``v``'s, into a tensor of its own (the first may be
    dout itself, which is autograd's) by specgen's sum, which a replay records as one
    more launch (``_engine.summed``)."""
    if g is None:
        return
    grads[v] = g if grads[v] is None else _engine.summed(grads[v], g)


def _differentiable(ctx, chain, tensors, values, dout):
    """The chain's gradients as functions that autograd can differentiate again (a
    backward with ``create_graph``): each pair recomputed by the registered,
    differentiable convolution and PyTorch's batch norm over the batch's statistics,
    its value kept exactly the saved one (the recomputation's difference from it
    added with no value) and its activation's gate read off the saved output."""
    wanted = ctx.needs_input_grad[:-1]
    v = [values[0]]
    for k, part in enumerate(ctx.parts):
        w, b, gamma, beta = tensors[PER_PAIR * k : PER_PAIR * k + 4]
        lay, k_norm, x = part.lay, part.kernels, v[chain.src[k]]
        weight = w.to(x.dtype) if part.cast else w
        args = (list(lay.stride), list(lay.pads), list(lay.dilation), lay.groups)
        y = torch.ops.specgen.conv2d(x, weight, b, *args)
        z = F.batch_norm(y, None, None, gamma, beta, True, 0.0, k_norm.eps)
        if chain.res[k] is not None:
            z = z + v[chain.res[k]]
        out = values[k + 1]
        if k_norm.act:
            z = B.gated(z, out, k_norm.act)
        v.append(out.detach() + (z - z.detach()))
    inputs = (values[0], *tensors)
    wrt = [t for t, want in zip(inputs, wanted) if want and t is not None]
    found = iter(torch.autograd.grad(v[-1], wrt, dout, create_graph=True, allow_unused=True))
    return tuple(next(found) if want and t is not None else None for t, want in zip(inputs, wanted))


_apply = _apply_of(ChainFunction)


class Memo:
    """A chain's last call: what it read (``_form``) and what its node is handed."""

    def __init__(self, form: tuple, tensors: tuple, chain: Chain):
        self.form, self.tensors, self.chain = form, tensors, chain


# Each chain's memo, by the module whose forward runs it (the entry goes with it).
_memos: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def run_chain(owner: torch.nn.Module, stages: tuple, x):
    """``stages`` (``nn.Sequential`` modules of residual blocks) applied in turn to x:
    as one node where the last call of ``owner``'s chain read the same, else by the
    blocks' own forwards (module docstring)."""
    steps = program(stages) if ENABLED and _served(x) else None
    if steps is None:
        return _in_turn(stages, x)
    form = _form(steps, x)
    memo = _memos.get(owner)
    if memo is not None and memo.form == form:
        return _apply(x, *memo.tensors, memo.chain)
    found: list = []
    with C.collecting(found):
        out = _in_turn(stages, x)
    if [bn for bn, *_ in found] == [st.bn for st in steps]:
        tensors = tuple(t for _, given, _ in found for t in given)
        _memos[owner] = Memo(form, tensors, Chain(steps, [last for *_, last in found]))
    else:
        _memos.pop(owner, None)
    return out


def describe(model: torch.nn.Module) -> str:
    """The chains a model's forward runs, in a line: how many pairs in how many
    chains (each module's ``chain_stages`` that can be one); "" where there are none."""
    found = [program(m.chain_stages()) for m in model.modules() if hasattr(m, "chain_stages")]
    found = [steps for steps in found if steps]
    if not found:
        return ""
    pairs = sum(len(steps) for steps in found)
    chains = f"{len(found)} chains" if len(found) > 1 else "one chain"
    return f"residual stages: {pairs} pairs as {chains}, one node each way from the second call"


def _in_turn(stages: tuple, x):
    for stage in stages:
        x = stage(x)
    return x


def _served(x) -> bool:
    return (
        isinstance(x, torch.Tensor)
        and x.is_cuda
        and x.dim() == 4
        and not torch.compiler.is_compiling()
    )


def _form(steps: list[PairStep], x) -> tuple:
    """What a chain's node depends on, read in microseconds: x's size, strides, dtype,
    device and 16-byte start, the autocast and tf32 state, and each pair's modules
    (``_convnorm._modules_form``; the values between the pairs follow from x's and
    theirs), in training mode or not."""
    head = (x.shape, x.stride(), x.dtype, x.get_device(), x.data_ptr() % 16 == 0, C._math())
    return head, tuple((C._modules_form(st.conv, st.bn), st.bn.training) for st in steps)
