"""Small helpers the driver-side parts of the Ray engine share.

* :func:`wait_quietly`: wait for actor calls whose failure is noticed elsewhere;
* :func:`json_default`: numpy values (and anything else) in metrics and event logs as JSON.

>>> import json, numpy as np
>>> json.dumps({"n": np.int64(3), "a": np.arange(2)}, default=json_default)
'{"n": 3, "a": [0, 1]}'
"""
from __future__ import annotations

import numpy as np
import ray

__all__ = ["json_default", "wait_quietly"]


def wait_quietly(refs, timeout: float = 30) -> list[BaseException]:
    """Wait for each of ``refs`` (at most ``timeout`` s each); a call that failed or timed out does
    not stop the others. Returns the errors: the callers send calls to actors that may have died,
    and a death is noticed and reported where it happens (the deployment's kills, the links' drop
    reports, the feeder's and the control loop's own calls).

    >>> wait_quietly([])
    []
    """
    errors = []
    for r in refs:
        try:
            ray.get(r, timeout=timeout)
        except Exception as e:  # returned to the caller; see the docstring
            errors.append(e)
    return errors


def json_default(o):
    """JSON for what ``json.dumps`` cannot write: numpy scalars and arrays, else ``repr``."""
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    return repr(o)
