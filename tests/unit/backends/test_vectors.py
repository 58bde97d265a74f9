"""Row normalisation: unit rows, zero rows left at zero, float32 out."""

import numpy as np

from chatqna.backends.vectors import l2_normalise


def test_rows_become_unit_length_and_zero_rows_stay_zero() -> None:
    out = l2_normalise(np.array([[3.0, 4.0], [0.0, 0.0]]))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]], rtol=1e-6)
