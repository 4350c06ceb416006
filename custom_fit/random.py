"""Seeded random numbers for training steps, the same code on Keras 3 and Keras 2.

A step that draws noise (a GAN's latent vectors, a diffusion model's noise, a
mixup coefficient) should draw from a seed generator that the model owns: its
state is a variable, so it is saved with the model and resumed by
``BackupAndRestore``, and every replica of a ``tf.distribute`` strategy draws
the same numbers. Keras 3 has ``keras.random.SeedGenerator``; Keras 2 has none
(``tf.random.Generator`` draws different numbers on each replica).
:class:`SeedGenerator` is Keras 3's class on Keras 3 and a layer with one
``int64`` state weight on Keras 2; :func:`normal` and :func:`uniform` take
either an ``int`` seed or a :class:`SeedGenerator`.

Example:
    >>> import custom_fit
    >>> from custom_fit import random
    >>> class Noisy(custom_fit.CustomModel):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.seed_generator = random.SeedGenerator(42)
    ...         self.dense = custom_fit.keras.layers.Dense(1)
    ...
    ...     def call(self, x):
    ...         return self.dense(x + 0.1 * random.normal(x.shape, seed=self.seed_generator))
    >>> tuple(random.uniform((2, 3), seed=1).shape)
    (2, 3)
"""

from __future__ import annotations

from typing import Any

from custom_fit._compat import version

__all__ = ["SeedGenerator", "normal", "uniform"]

#: A seed generator a model owns: ``keras.random.SeedGenerator`` on Keras 3, an equivalent layer on Keras 2.
SeedGenerator = version.SeedGenerator


def normal(shape: Any, seed: int | Any) -> Any:
    """Standard normal numbers of ``shape``.

    Args:
        shape: The shape of the result.
        seed: An ``int`` (the same numbers on every call) or a :class:`SeedGenerator`
            (new numbers on every call, reproducible from its state).

    Returns:
        A ``float32`` tensor.
    """
    return version.random_normal(shape, seed)


def uniform(shape: Any, seed: int | Any) -> Any:
    """Uniform numbers in ``[0, 1)`` of ``shape``; ``seed`` as for :func:`normal`."""
    return version.random_uniform(shape, seed)
