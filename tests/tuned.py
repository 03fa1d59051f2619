"""Tuned winners recorded in the results database (``tunedb``) as a tune would record
them, for tests of what the operator and the planner do with measured winners."""

from specgen import tunedb

H200 = "NVIDIA H200"


def winner(shape, variant, ms, precision, gpu=H200, batch=128, date="2026-11-22"):
    """A winner of ``shape`` (a ConvProblem) on ``gpu``: ``variant``'s name, timed at
    ``ms`` at ``batch`` images, in ``precision`` (its value)."""
    tunedb.append(
        dict(
            kind="winner",
            gpu=gpu,
            shape=shape.spec,
            batch=batch,
            precision=precision,
            variant=variant,
            ms=ms,
            date=date,
        )
    )
