"""The driver of a driver-kill trial of ``replistream chaos --driver-kills`` (:mod:`replistream.chaos`).

Run by the campaign in a process of its own, joined to the campaign's Ray through ``RAY_ADDRESS``::

    python -m replistream.chaos_driver SPEC.json

``SPEC.json`` (written by :func:`replistream.chaos.run_driver_trial`) names the trial's query and
seed, the ``deploy`` options, a folder of Parquet files per source, a folder per application and
the pace. The driver deploys the query detached (``deploy(..., name=..., detached=True)``) with a
:class:`~replistream.sinks.ParquetSink` per application, starts feeding the files paced
(:class:`~replistream.files.FileSource`), prints ``fed`` on stdout and then only waits, at most
``linger_s`` seconds, to be killed: the campaign kills it with SIGKILL mid-replay, attaches to the
deployment, waits for it and stops it. The driver never stops the deployment itself.
"""
from __future__ import annotations

import json
import sys
import time


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    from .chaos import file_sources, trial_workload
    from .engines.ray import deploy
    from .sinks import ParquetSink

    query = trial_workload(spec["query"], int(spec["seed"]))[0]
    sinks = {app: ParquetSink(path, every=int(spec["sink_every"])) for app, path in spec["sinks"].items()}
    dep = deploy(query, **spec["options"], name=spec["name"], detached=True, sinks=sinks, progress=False)
    dep.feed(file_sources(spec["inputs"], int(spec["chunk"])), pace=float(spec["pace"]))
    print("fed", flush=True)
    time.sleep(float(spec["linger_s"]))  # killed meanwhile; if not, exits and leaves the deployment running
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m replistream.chaos_driver SPEC.json (written by replistream chaos --driver-kills)")
    sys.exit(main(sys.argv[1]))
