"""wtap's staged bands: the buffers' shapes, and how a block's warps and lanes copy each
band of x and dy rows into them (``cp.async``, a warp a row, a lane a copy along it)."""

from __future__ import annotations

from ..plan.common import ceil_div, quad_stride
from .persist import _vector


def layout(p, v) -> dict:
    """The band buffers' shapes: x [chans][x_rows][x_stride], then dy [maps][rows]
    [dy_stride] (a map's plane padded for distinct bank quads)."""
    (sh, sw), (dh, dw) = p.stride, p.dil
    steps = ceil_div(p.Wo, v.pixels)
    shift = v.pixels * sw  # x values a step slides in
    vx, vd = _vector(shift), _vector(v.pixels)
    nx = (v.pixels - 1) * sw + (p.S - 1) * dw + 1  # x values under a step's window
    pre = ceil_div(max(nx - shift, 0), vx) * vx  # held over from the step before
    x_cols = steps * shift + pre  # the columns a row's steps read
    x_rows = (v.tile - 1) * sh + (p.R - 1) * dh + 1
    # Staging copies of 16, 8 or 4 bytes: as wide as x's rows (and the left padding) keep
    # them aligned in both memories.
    gx = next(g for g in (4, 2, 1) if p.W % g == 0 and p.pads[2] % g == 0)
    gd = next(g for g in (4, 2, 1) if p.Wo % g == 0)
    x_cols = ceil_div(x_cols, gx) * gx
    x_stride = quad_stride(x_cols, 4)
    dy_cols = steps * v.pixels
    dy_stride = ceil_div(dy_cols, 4) * 4
    # dy's copies cover the row and no more: the last step multiplies only the outputs
    # inside it, so what its vector load reads past them is never used.
    dy_copied = ceil_div(p.Wo, gd) * gd
    dy_plane = quad_stride(v.tile * dy_stride, 4)
    # a warp's lanes read several channels' planes at once: they start in different bank
    # quads as the rows do
    x_plane = quad_stride(x_rows * x_stride, 4) if v.chans > 1 else x_rows * x_stride
    x_band = v.chans * x_plane
    dy_band = v.maps * dy_plane
    return dict(
        steps=steps,
        shift=shift,
        vx=vx,
        vd=vd,
        pre=pre,
        window=pre + shift,
        x_cols=x_cols,
        x_rows=x_rows,
        gx=gx,
        gd=gd,
        x_chunks=x_cols // gx,
        dy_chunks=dy_copied // gd,
        x_copy=4 * gx,  # bytes a copy
        dy_copy=4 * gd,
        x_last_copy=p.W - gx,  # the last copy's first column: sources are clamped to it
        dy_last_copy=p.Wo - gd,
        x_row_step=sh * x_stride,  # x's step from one output row to the next
        x_tap_step=dh * x_stride,  # and from one window row to the next
        x_stride=x_stride,
        x_plane=x_plane,
        dy_cols=dy_cols,
        dy_stride=dy_stride,
        dy_plane=dy_plane,
        x_band=x_band,
        dy_band=dy_band,
        buffer=ceil_div(x_band + dy_band, 4) * 4,
        ones_words=ceil_div(x_cols, 4) * 4 if p.bias else 0,
    )


def _copy_rounds(lay: dict, plane_rows: int, t: str, warps: int) -> dict:
    """How the rows of a band's planes of x or dy (``t``) meet the warps and lanes:
    rounds of a warp a row (and the warps of the last round), and rounds of a lane a
    copy along a row (and the lanes of the last)."""
    chunks = lay[f"{t}_chunks"]
    rounds = ceil_div(chunks, 32)
    iters = ceil_div(plane_rows, warps)
    return {
        f"{t}_iters": iters,
        f"{t}_tail_warps": plane_rows - (iters - 1) * warps,
        f"{t}_round_words": warps * lay[f"{t}_stride"],
        f"{t}_rounds": rounds,
        f"{t}_tail_lanes": chunks - 32 * (rounds - 1),
        f"{t}_round_bytes": 32 * lay[f"{t}_copy"],
    }


def copies(p, v, lay: dict, warps: int) -> dict:
    """The rounds in which the block's warps copy a band's x and dy rows; whether every
    band's rows are the image's (no row of a copy is then checked); and, where dy's are
    and the rows' last chunks of a warp's rounds are at most 32, those chunks one copy
    of a lane each, not a round of mostly idle lanes a row."""
    ctx = {
        **_copy_rounds(lay, lay["x_rows"], "x", warps),
        **_copy_rounds(lay, v.tile, "dy", warps),
        "x_rows_inside": all(
            0 <= b * v.tile * p.stride[0] - p.pads[0]
            and b * v.tile * p.stride[0] - p.pads[0] + lay["x_rows"] <= p.H
            for b in range(ceil_div(p.Ho, v.tile))
        ),
        "dy_rows_inside": p.Ho % v.tile == 0,
    }
    tail, iters, rounds = ctx["dy_tail_lanes"], ctx["dy_iters"], ctx["dy_rounds"]
    per_warp, per_map = tail * iters * v.maps, tail * iters
    # more than 32 go in rounds of 32 lanes, each round the same lanes' copies of the
    # next maps (a literal offset): where a map's copies divide 32
    flat = ctx["dy_rows_inside"] and tail < 32 and (per_warp <= 32 or 32 % per_map == 0)
    tail_rounds = ceil_div(per_warp, 32)
    round_maps = 32 // per_map if tail_rounds > 1 else 0  # maps a round on from the last
    last_lanes = per_warp - 32 * (tail_rounds - 1)
    ctx.update(
        dy_flat_tail=flat,
        dy_tail_copies=per_warp,  # the warp's rows' last chunks, a lane each
        dy_tail_map_copies=per_map,  # and those of one map
        dy_tail_rounds=tail_rounds,
        dy_tail_round_maps=round_maps,
        dy_tail_round_bytes=4 * lay["dy_plane"] * round_maps,  # a round's offsets in smem
        dy_tail_round_src=p.Ho * p.Wo * round_maps,  # and in dy (floats)
        dy_tail_last_lanes=last_lanes,  # the last round's lanes
        # whether every lane of every round copies (else a round checks the lane)
        dy_tail_every_lane=last_lanes == 32 and ctx["dy_tail_warps"] == warps,
        dy_full_rounds=rounds - 1,
        dy_last_iter=iters - 1,
        dy_tail_chunk=32 * (rounds - 1),  # a row's first chunk past its whole rounds
        dy_tail_at=ctx["dy_round_bytes"] * (rounds - 1),  # and its byte offset
        x_round_src_words=warps * p.W,  # a warp's next round of rows in x
        dy_round_src_words=warps * p.Wo,  # and in dy
    )
    return ctx
