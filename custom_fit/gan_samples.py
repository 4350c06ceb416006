"""Watching a GAN train: its samples after each epoch, tiled into one image.

Optional helpers for notebooks and demos (``notebooks/04_gan_multi_loss.ipynb``
uses them); nothing else in custom_fit does.

Example:
    >>> import numpy as np
    >>> from custom_fit.gan_samples import image_grid
    >>> image_grid(np.ones((5, 2, 3))).shape  # 3 columns, 2 rows
    (4, 9)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from custom_fit._compat import keras

__all__ = ["GenerateSamples", "image_grid"]


class GenerateSamples(keras.callbacks.Callback):
    """Keeps ``model.generate(n)`` from the end of every epoch (same noise each time).

    Attributes:
        samples: One array of ``n`` samples per finished epoch.

    Example:
        >>> import custom_fit
        >>> sampler = custom_fit.gan_samples.GenerateSamples(n=16)
        >>> # gan.fit(x, epochs=5, callbacks=[sampler]); sampler.samples[-1].shape -> (16, ...)
    """

    def __init__(self, n: int = 16, labels: Sequence[int] | None = None, seed: int = 0):
        super().__init__()
        self.n, self.labels, self.seed = n, labels, seed
        self.samples: list[np.ndarray] = []

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.samples.append(self.model.generate(self.n, labels=self.labels, seed=self.seed))


def image_grid(images: np.ndarray, columns: int | None = None) -> np.ndarray:
    """Tiles ``(n, h, w[, c])`` images into one ``(rows*h, columns*w[, c])`` image (blank cells: 0).

    Example:
        >>> import numpy as np, custom_fit
        >>> custom_fit.gan_samples.image_grid(np.ones((5, 2, 3))).shape  # 3 columns, 2 rows
        (4, 9)
    """
    images = np.asarray(images)
    n, h, w = images.shape[:3]
    columns = columns or int(np.ceil(np.sqrt(n)))
    rows = int(np.ceil(n / columns))
    grid = np.zeros((rows * h, columns * w, *images.shape[3:]), dtype=images.dtype)
    for i, image in enumerate(images):
        r, c = divmod(i, columns)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = image
    return grid
