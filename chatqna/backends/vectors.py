"""Vector maths shared by the embedders, the blend and the indexes."""

from __future__ import annotations

import numpy as np


def l2_normalise(matrix: np.ndarray) -> np.ndarray:
    """Scale each row to unit length (zero rows stay zero)."""
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    norms[norms == 0.0] = 1.0
    normalised: np.ndarray = (matrix / norms).astype(np.float32, copy=False)
    return normalised
