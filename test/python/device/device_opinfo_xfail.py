"""OpInfo entries that fail on the eager tpu device, each with its reason (strict)."""

XFAIL: dict[str, str] = {}
