"""Replica utility, garbage collection (Algorithm 6, Hwang §V-B) and revival (§V-C).

Imported as ``replistream.gc`` (a top-level ``gc`` would collide with Python's
built-in module). Filled in by the garbage-collection issue.
"""
