"""Trace-driven discrete-event simulator (imported as ``replistream.sim``).

It will drive the same operator logic as the runtime (DESIGN.md decision 2);
filled in by the simulator issue.
"""
