"""The blocks of a sweep's run order, named as the sweep, the statistics and the queue all read them."""

JOINT = "joint"  # the block of an ofat sweep's [[configs]]: no variable has this name


def stretch_of(block: str | None) -> str | None:
    """The stretch of the run order a block runs in, and the model's block: the axis, for every copy
    of its block (`cores#2` -> `cores`). One stretch holds all of a pass's copies side by side, so the
    model sees one block of 3 baselines and 3 of each value, not three blocks of one each (where a
    block effect fitted to two runs leaves neither any residual)."""
    return block.split("#", 1)[0] if block else block
