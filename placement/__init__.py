"""Replica placement (imported as ``replistream.placement``).

Network cost model, min-cost deployment (Algorithm 5, Hwang §V-A) and
baselines arrive with the placement issue; this package exists so the
namespace is stable from the start.
"""
