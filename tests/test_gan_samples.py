"""custom_fit.gan_samples: a GAN's samples kept after each epoch, and images tiled into one."""

from __future__ import annotations

import numpy as np

from custom_fit.gan_samples import GenerateSamples, image_grid


def test_image_grid_tiles_row_by_row_and_leaves_blank_cells_zero():
    images = np.arange(1, 6, dtype="float32")[:, None, None] * np.ones((5, 2, 3), "float32")
    grid = image_grid(images)  # 5 images: 3 columns, 2 rows
    assert grid.shape == (4, 9) and grid.dtype == np.float32
    cells = [grid[r * 2 : (r + 1) * 2, c * 3 : (c + 1) * 3] for r in range(2) for c in range(3)]
    assert [float(cell.mean()) for cell in cells] == [1.0, 2.0, 3.0, 4.0, 5.0, 0.0]
    assert all(np.all(cell == cell[0, 0]) for cell in cells)


def test_image_grid_keeps_channels_and_takes_the_columns_asked_for():
    images = np.random.default_rng(0).random((4, 2, 2, 3))
    grid = image_grid(images, columns=4)
    assert grid.shape == (2, 8, 3)
    np.testing.assert_array_equal(grid[:, 6:8], images[3])


class _Generator:
    """Stands in for a GAN: records each ``generate`` call and returns distinct samples."""

    def __init__(self):
        self.calls = []

    def generate(self, n, labels=None, seed=None):
        self.calls.append((n, labels, seed))
        return np.full((n, 2, 2), len(self.calls), "float32")


def test_generate_samples_keeps_one_array_per_epoch_drawn_with_the_same_seed():
    model = _Generator()
    sampler = GenerateSamples(n=4, labels=[1, 2, 3, 4], seed=7)
    sampler.set_model(model)
    for epoch in range(3):
        sampler.on_epoch_end(epoch)
    assert model.calls == [(4, [1, 2, 3, 4], 7)] * 3
    assert [float(samples[0, 0, 0]) for samples in sampler.samples] == [1.0, 2.0, 3.0]
