"""OpInfo entries expected to fail through backend="tpu", each with its reason. The
lists may only shrink: the xfail is strict."""

FORWARD_XFAIL: dict[str, str] = {}

BACKWARD_XFAIL: dict[str, str] = {}
