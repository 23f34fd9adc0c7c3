"""Dynamo's function names for its trace logs, looked up only when such a log is on.

For every FX call it records, Dynamo builds a log header naming the user's source line
and the function around it (`InstructionTranslatorBase.get_line_of_code_header`, called
from `torch/_dynamo/output_graph.py`, `_create_proxy`) before it knows whether the
`trace_call` debug log will print it. Naming the function tokenizes the whole source
file in Python (`torch._dynamo.funcname_cache`): on the first call of the quickstart
model that is five files, ~0.1 s of the calling thread's CPU (torch/nn/modules/
activation.py alone 0.05-0.1 s; bench/first_call.py), spent on a header no one reads.

The header is read by Dynamo's `trace_call` and `trace_source` debug logs only (the
two other callers build it inside the lazily formatted message of those logs).
`install()` makes the lookup Dynamo's tracer uses return the name while either log is
enabled for DEBUG, and None (the header then omits the name) while neither is: a message
that is printed reads exactly as before; one that is dropped costs no tokenizing.
"""

from __future__ import annotations

import logging
from typing import Callable

_MARK = "_torch_tpu_named_when_logged"


def install() -> bool:
    """Wraps `torch._dynamo.symbolic_convert.get_funcname` (once); False when this torch
    has no such lookup or no trace loggers to consult, leaving Dynamo as it is."""
    from torch._dynamo import output_graph, symbolic_convert

    lookup = getattr(symbolic_convert, "get_funcname", None)
    if lookup is None or getattr(lookup, _MARK, False):
        return lookup is not None
    loggers = [
        logger
        for logger in (
            getattr(symbolic_convert, "trace_call_log", None),
            getattr(symbolic_convert, "trace_source_log", None),
            getattr(output_graph, "trace_call_log", None),
        )
        if isinstance(logger, logging.Logger)
    ]
    if not loggers:
        return False
    symbolic_convert.get_funcname = named_when_logged(lookup, loggers)
    return True


def named_when_logged(lookup: Callable[[str, int], str | None],
                      loggers: list[logging.Logger]) -> Callable[[str, int], str | None]:
    def get_funcname(filename: str, lineno: int) -> str | None:
        # Checked per call: TORCH_LOGS / torch._logging.set_logs may turn a log on later.
        if any(logger.isEnabledFor(logging.DEBUG) for logger in loggers):
            return lookup(filename, lineno)
        return None

    setattr(get_funcname, _MARK, True)
    get_funcname.__wrapped__ = lookup  # type: ignore[attr-defined]
    return get_funcname
