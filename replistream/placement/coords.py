"""Network coordinates from a latency matrix: classical multidimensional scaling.

Pietzuch et al. (ICDE 2006, the paper's reference [18]) place operators in a
*latency space*: a Euclidean space whose distances approximate network
latencies (they use Vivaldi coordinates). Here the coordinator knows the whole
latency matrix, so classical (Torgerson) MDS computes the coordinates in one
eigen-decomposition: symmetrise, square, double-centre, and keep the
``dim`` largest eigenpairs. Deterministic: each axis's sign is fixed so that
its largest-magnitude component is positive.

>>> L = np.array([[0, 3, 4], [3, 0, 5], [4, 5, 0]], dtype=float)   # a 3-4-5 triangle
>>> X = network_coordinates(L, dim=2)
>>> np.allclose(np.linalg.norm(X[:, None] - X[None], axis=2), L)
True
"""
from __future__ import annotations

import numpy as np

__all__ = ["network_coordinates", "embedding_error", "coordinate_latency"]


def network_coordinates(latency, dim: int = 3) -> np.ndarray:
    """Coordinates (ms units, one row per server) whose distances approximate ``latency``.

    The matrix is symmetrised (mean of both directions) and its diagonal
    ignored. Fewer than ``dim`` positive eigenvalues leave the remaining axes
    at zero.

    >>> network_coordinates([[0, 10], [10, 0]], dim=1).tolist()
    [[5.0], [-5.0]]
    """
    L = np.asarray(latency, dtype=np.float64)
    n = L.shape[0]
    if L.ndim != 2 or L.shape != (n, n):
        raise ValueError(f"latency must be a square matrix, got shape {L.shape}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    D = 0.5 * (L + L.T)
    np.fill_diagonal(D, 0.0)
    D2 = D * D
    row = D2.mean(axis=1)
    B = -0.5 * (D2 - row[:, None] - row[None, :] + row.mean())  # double centring, J D2 J, without matmuls
    m = min(dim, n)
    import scipy.linalg  # on first use: placement.servers (the Ray engine's start) needs only coordinate_latency

    vals, vecs = scipy.linalg.eigh(B, subset_by_index=[n - m, n - 1], driver="evr")  # the largest m eigenpairs
    order = np.argsort(-vals, kind="stable")
    vals, vecs = vals[order], vecs[:, order]
    X = np.zeros((n, dim))
    for a in range(m):
        if vals[a] <= 1e-12 * max(1.0, abs(vals[0])):
            continue
        v = vecs[:, a]
        if v[np.argmax(np.abs(v))] < 0:
            v = -v
        X[:, a] = v * np.sqrt(vals[a])
    return X


def coordinate_latency(coords) -> np.ndarray:
    """Euclidean distances between coordinate rows (a latency matrix from network coordinates).

    >>> coordinate_latency([[0, 0], [3, 4]]).tolist()
    [[0.0, 5.0], [5.0, 0.0]]
    """
    X = np.asarray(coords, dtype=np.float64)
    if X.ndim == 1:
        X = X[:, None]
    return np.linalg.norm(X[:, None, :] - X[None, :, :], axis=2)


def embedding_error(latency, coords) -> float:
    """Median relative error of the coordinate distances against the (symmetrised) latencies.

    >>> embedding_error([[0, 10], [10, 0]], [[0.0], [10.0]])
    0.0
    """
    L = np.asarray(latency, dtype=np.float64)
    D = 0.5 * (L + L.T)
    E = coordinate_latency(coords)
    iu = np.triu_indices(len(D), 1)
    d, e = D[iu], E[iu]
    keep = d > 0
    if not keep.any():
        return 0.0
    return float(np.median(np.abs(e[keep] - d[keep]) / d[keep]))
