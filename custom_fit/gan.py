"""``GAN``: a generative adversarial network trained with ``fit()``.

Built on :class:`custom_fit.CustomModel`: two named optimizers
(``"generator"``, ``"discriminator"``), losses reported as epoch means
(``d_loss``, ``g_loss``, and ``gradient_penalty`` for WGAN-GP), a seeded noise
generator whose state is saved with the model, and :meth:`GAN.generate` for
samples. The adversarial loss is a :class:`GANLoss` chosen once by name
(:data:`LOSSES`). Override one piece to change it:
:meth:`GAN.discriminator_loss`, :meth:`GAN.generator_loss`,
:meth:`GAN.gradient_penalty`, :meth:`GAN.train_discriminator` or
:meth:`GAN.train_generator`. Helpers to watch samples while a GAN trains are
in :mod:`custom_fit.gan_samples`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from custom_fit import _optimizers as optimizers
from custom_fit import random
from custom_fit._compat import keras
from custom_fit._losses import batch_mean, regularization_loss
from custom_fit._model import CustomModel
from custom_fit._optimizers import NamedOptimizers

__all__ = ["GAN", "LOSSES", "GANLoss"]


@dataclasses.dataclass(frozen=True)
class GANLoss:
    """An adversarial loss: how the discriminator (critic) and the generator are scored.

    Attributes:
        name: The name ``GAN(loss=...)`` takes.
        discriminator_steps: Discriminator updates per generator update by default.
        gradient_penalty: Whether the discriminator's loss adds a gradient
            penalty (WGAN-GP), logged as ``gradient_penalty``.
        optimizer: The default ``Adam`` settings of both optimizers.

    Example:
        >>> import numpy as np
        >>> float(LOSSES["hinge"].discriminator_loss(np.ones(4, "float32"), -np.ones(4, "float32")))
        0.0
    """

    name: str
    discriminator_steps: int = 1
    gradient_penalty: bool = False
    optimizer: dict[str, float] = dataclasses.field(default_factory=lambda: {"learning_rate": 2e-4, "beta_1": 0.5})

    def discriminator_loss(self, real_logits: Any, fake_logits: Any) -> tf.Tensor:
        """The discriminator's (critic's) loss from its logits on real and generated samples."""
        raise NotImplementedError

    def generator_loss(self, fake_logits: Any) -> tf.Tensor:
        """The generator's loss from the discriminator's logits on generated samples (Wasserstein and hinge)."""
        return -batch_mean(fake_logits)


class _NonSaturating(GANLoss):
    def discriminator_loss(self, real_logits: Any, fake_logits: Any) -> tf.Tensor:
        return batch_mean(tf.nn.softplus(-real_logits)) + batch_mean(tf.nn.softplus(fake_logits))

    def generator_loss(self, fake_logits: Any) -> tf.Tensor:
        return batch_mean(tf.nn.softplus(-fake_logits))  # -log(sigmoid(fake))


class _Hinge(GANLoss):
    def discriminator_loss(self, real_logits: Any, fake_logits: Any) -> tf.Tensor:
        return batch_mean(tf.nn.relu(1.0 - real_logits)) + batch_mean(tf.nn.relu(1.0 + fake_logits))


class _Wasserstein(GANLoss):
    def discriminator_loss(self, real_logits: Any, fake_logits: Any) -> tf.Tensor:
        return batch_mean(fake_logits) - batch_mean(real_logits)


#: The adversarial losses ``GAN(loss=...)`` takes, by name: non-saturating binary cross-entropy,
#: hinge, and Wasserstein with gradient penalty (5 critic steps, Adam(1e-4, 0.0, 0.9)).
LOSSES: dict[str, GANLoss] = {
    "bce": _NonSaturating("bce"),
    "hinge": _Hinge("hinge"),
    "wgan-gp": _Wasserstein(
        "wgan-gp",
        discriminator_steps=5,
        gradient_penalty=True,
        optimizer={"learning_rate": 1e-4, "beta_1": 0.0, "beta_2": 0.9},
    ),
}
_ROLES = ("generator", "discriminator")
# compile() arguments a GAN has no use for: it computes and logs its own losses.
_UNUSED_COMPILE_ARGUMENTS = ("loss", "loss_weights", "metrics", "weighted_metrics")


def _as_names(optimizer: Any) -> list[Any]:
    """The names of a dict (or group) of optimizers; ``[]`` for a single optimizer."""
    return list(optimizer) if isinstance(optimizer, (dict, NamedOptimizers)) else []


@keras.saving.register_keras_serializable(package="custom_fit")
class GAN(CustomModel):
    """A GAN from a generator and a discriminator, trained by ``fit(real_data)``.

    ``fit`` takes real samples ``x`` (and class labels ``y`` when
    ``num_classes`` is set). Each step trains the discriminator
    ``discriminator_steps`` times on the batch with fresh noise, then the
    generator once.

    Args:
        generator: A built model mapping noise ``(batch, latent_dim)`` (and,
            when conditional, integer labels ``(batch,)`` as a second input)
            to samples.
        discriminator: A built model mapping samples (and labels) to one
            logit per sample (no sigmoid).
        latent_dim: Size of the noise vector.
        loss: ``"bce"`` (non-saturating), ``"hinge"`` or ``"wgan-gp"``.
        discriminator_steps: Discriminator (critic) updates per generator
            update; default 5 for ``"wgan-gp"``, else 1.
        gradient_penalty_weight: Weight of the WGAN-GP gradient penalty.
        num_classes: Number of classes for a conditional GAN, else ``None``.
        seed: Seed of the noise generator (its state is saved with the model).
        **kwargs: Passed to ``keras.Model`` (e.g. ``name``).

    Example:
        >>> import numpy as np, keras, custom_fit
        >>> generator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        >>> discriminator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> gan = custom_fit.GAN(generator, discriminator, latent_dim=4, seed=0)
        >>> gan.compile()  # Adam(2e-4, beta_1=0.5) for both
        >>> history = gan.fit(np.random.default_rng(0).normal(size=(64, 2)), epochs=1, verbose=0)
        >>> sorted(history.history)
        ['d_loss', 'g_loss']
        >>> gan.generate(3).shape
        (3, 2)
    """

    logged_values: Sequence[str] = ("d_loss", "g_loss")

    def __init__(
        self,
        generator: keras.Model,
        discriminator: keras.Model,
        latent_dim: int,
        loss: str = "bce",
        discriminator_steps: int | None = None,
        gradient_penalty_weight: float = 10.0,
        num_classes: int | None = None,
        seed: int | None = None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        if loss not in LOSSES:
            raise ValueError(
                f"GAN loss must be one of {tuple(LOSSES)}, received loss={loss!r}. Fix: pick one of those."
            )
        for role, model in (("generator", generator), ("discriminator", discriminator)):
            if not isinstance(model, keras.Model) or not model.built:
                raise ValueError(
                    f"GAN expected a built keras.Model as {role}, received "
                    f"{type(model).__name__}{' (not built)' if isinstance(model, keras.layers.Layer) else ''}. "
                    "Fix: build it with an Input, e.g. keras.Sequential([keras.Input(shape), ...]) "
                    "or a functional model."
                )
        self.generator = generator
        self.discriminator = discriminator
        self.latent_dim = int(latent_dim)
        self.loss_name = loss
        self.adversarial_loss = LOSSES[loss]
        self.discriminator_steps = int(discriminator_steps or self.adversarial_loss.discriminator_steps)
        self.gradient_penalty_weight = float(gradient_penalty_weight)
        self.num_classes = num_classes
        self.seed = seed
        self.noise_generator = random.SeedGenerator(seed, name="noise_generator")
        # Evaluation draws its own noise, so validation does not change training.
        self.eval_noise_generator = random.SeedGenerator(
            None if seed is None else seed + 1, name="eval_noise_generator"
        )
        if self.adversarial_loss.gradient_penalty:
            self.logged_values = ("d_loss", "g_loss", "gradient_penalty")
        self.built = True

    # -- configuration -------------------------------------------------------

    def compile(self, optimizer: Any = optimizers.UNSET, *args: Any, **kwargs: Any) -> None:
        """``CustomModel.compile`` with GAN defaults.

        Args:
            optimizer: ``{"generator": ..., "discriminator": ...}``; default
                ``Adam(2e-4, beta_1=0.5)`` for both (``Adam(1e-4, beta_1=0.0,
                beta_2=0.9)`` for ``"wgan-gp"``). ``None`` means no optimizer,
                as for every ``CustomModel``: the GAN can then evaluate and
                generate, but not train.
            *args: Not accepted (``compile``'s positional ``loss``).
            **kwargs: As for :meth:`CustomModel.compile` (``steps_per_execution``,
                ``jit_compile``, ...), except the loss and metrics arguments.

        Raises:
            ValueError: A loss or metrics are given (the GAN computes and logs
                its own losses), or ``optimizer`` is not one optimizer per part.
        """
        given = {name for name in _UNUSED_COMPILE_ARGUMENTS if kwargs.get(name) is not None} | (
            {"loss"} if args else set()
        )
        if given:
            raise ValueError(
                f"GAN.compile() received {sorted(given)}, which a GAN does not use: it computes its losses "
                f"itself (loss={self.loss_name!r} was given to GAN(...)) and logs them as d_loss and g_loss. "
                "Expected only optimizers and running options. Fix: leave them out of compile(); choose the "
                "loss with GAN(..., loss='bce' | 'hinge' | 'wgan-gp') or override discriminator_loss / "
                "generator_loss."
            )
        if optimizer is not optimizers.UNSET and optimizer is not None and set(_as_names(optimizer)) != set(_ROLES):
            raise ValueError(
                f"GAN.compile() received optimizer={optimizer!r}; a GAN trains two models with two "
                f"optimizers. Expected a dict with the keys {list(_ROLES)}. Fix: compile(optimizer="
                "{'generator': keras.optimizers.Adam(2e-4), 'discriminator': keras.optimizers.Adam(2e-4)}), "
                "or leave optimizer out for the defaults."
            )
        if optimizer is optimizers.UNSET:
            optimizer = {role: keras.optimizers.Adam(**self.adversarial_loss.optimizer) for role in _ROLES}
        super().compile(optimizer, *args, **kwargs)

    # -- forward -------------------------------------------------------------

    def call(self, inputs: Any, training: bool = False) -> Any:
        """Generates samples from noise (``[noise, labels]`` when conditional)."""
        return self.generator(inputs, training=training)

    def sample_noise(self, batch_size: Any, training: bool = True) -> tf.Tensor:
        """Noise for ``batch_size`` samples from the seeded generator (evaluation: its own).

        Under ``tf.distribute`` every replica draws the noise of the whole
        global batch (same seed state) and keeps its own slice, so training
        matches one device that draws the global batch at once.
        """
        seed = self._noise_seed(training)
        context = tf.distribute.get_replica_context()
        replicas = context.num_replicas_in_sync if context is not None else 1
        if replicas == 1:
            return random.normal((batch_size, self.latent_dim), seed)
        noise = random.normal((batch_size * replicas, self.latent_dim), seed)
        start = context.replica_id_in_sync_group * batch_size
        return noise[start : start + batch_size]

    def _noise_seed(self, training: bool) -> Any:
        """The training noise generator, or evaluation's own (validation must not change training)."""
        return self.noise_generator if training else self.eval_noise_generator

    def _generator_inputs(self, noise: Any, labels: Any) -> Any:
        return noise if self.num_classes is None else [noise, labels]

    def _discriminate(self, samples: Any, labels: Any, training: bool) -> tf.Tensor:
        inputs = samples if self.num_classes is None else [samples, labels]
        return tf.cast(self.discriminator(inputs, training=training), "float32")

    # -- losses --------------------------------------------------------------

    def discriminator_loss(self, real_logits: tf.Tensor, fake_logits: tf.Tensor) -> tf.Tensor:
        """The discriminator's (critic's) loss from its logits on real and generated samples."""
        return self.adversarial_loss.discriminator_loss(real_logits, fake_logits)

    def generator_loss(self, fake_logits: tf.Tensor) -> tf.Tensor:
        """The generator's loss from the discriminator's logits on generated samples."""
        return self.adversarial_loss.generator_loss(fake_logits)

    def gradient_penalty(self, real: Any, fake: Any, labels: Any, training: bool = True) -> tf.Tensor:
        """WGAN-GP penalty: mean of (||d critic / d x|| - 1)^2 at points between real and fake.

        Computed with a tape nested inside the discriminator's tape, so the
        update differentiates through it (a second-order gradient).
        """
        shape = [tf.shape(real)[0]] + [1] * (len(real.shape) - 1)
        alpha = random.uniform(shape, self._noise_seed(training))
        between = real + alpha * (tf.cast(fake, real.dtype) - real)
        with tf.GradientTape() as tape:
            tape.watch(between)
            logits = self._discriminate(between, labels, training=True)
        grads = tape.gradient(logits, between)
        norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=list(range(1, len(grads.shape)))) + 1e-12)
        return batch_mean(tf.square(norm - 1.0))

    # -- steps ---------------------------------------------------------------

    def train_discriminator(self, real: Any, labels: Any = None) -> tuple[tf.Tensor, tf.Tensor]:
        """One discriminator update; returns ``(d_loss, gradient_penalty)``."""
        batch_size = tf.shape(real)[0]
        fake = self.generator(self._generator_inputs(self.sample_noise(batch_size), labels), training=True)
        with tf.GradientTape() as tape:
            real_logits = self._discriminate(real, labels, training=True)
            fake_logits = self._discriminate(fake, labels, training=True)
            d_loss = self.discriminator_loss(real_logits, fake_logits)
            penalty = tf.zeros(())
            if self.adversarial_loss.gradient_penalty:
                penalty = self.gradient_penalty(real, fake, labels)
                d_loss = d_loss + self.gradient_penalty_weight * penalty
            d_loss = d_loss + regularization_loss(self.discriminator)
        self.minimize(d_loss, tape, self.discriminator.trainable_weights, optimizer="discriminator")
        return d_loss, penalty

    def train_generator(self, batch_size: Any, labels: Any = None) -> tf.Tensor:
        """One generator update; returns ``g_loss``."""
        with tf.GradientTape() as tape:
            fake = self.generator(self._generator_inputs(self.sample_noise(batch_size), labels), training=True)
            g_loss = self.generator_loss(self._discriminate(fake, labels, training=True))
            g_loss = g_loss + regularization_loss(self.generator)
        self.minimize(g_loss, tape, self.generator.trainable_weights, optimizer="generator")
        return g_loss

    def train_step(self, data: Any) -> dict[str, Any]:
        """Discriminator update(s), then a generator update; logs epoch means."""
        real, labels = self._unpack_real(data)
        for _ in range(self.discriminator_steps):
            d_loss, penalty = self.train_discriminator(real, labels)
        g_loss = self.train_generator(tf.shape(real)[0], labels)
        self._log(real, d_loss, g_loss, penalty)
        return self.get_metrics_result()

    def test_step(self, data: Any) -> dict[str, Any]:
        """The same losses on a batch without updates (``val_d_loss``, ``val_g_loss``)."""
        real, labels = self._unpack_real(data)
        noise = self.sample_noise(tf.shape(real)[0], training=False)
        fake = self.generator(self._generator_inputs(noise, labels), training=False)
        fake_logits = self._discriminate(fake, labels, training=False)
        d_loss = self.discriminator_loss(self._discriminate(real, labels, training=False), fake_logits)
        penalty = tf.zeros(())
        if self.adversarial_loss.gradient_penalty:
            penalty = self.gradient_penalty(real, fake, labels, training=False)
            d_loss = d_loss + self.gradient_penalty_weight * penalty
        self._log(real, d_loss, self.generator_loss(fake_logits), penalty)
        return self.get_metrics_result()

    def _log(self, real: Any, d_loss: Any, g_loss: Any, penalty: Any) -> None:
        values = dict(d_loss=d_loss, g_loss=g_loss)
        if self.adversarial_loss.gradient_penalty:
            values["gradient_penalty"] = penalty
        self.log_values(real, **values)

    def _unpack_real(self, data: Any) -> tuple[Any, Any]:
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        if self.num_classes is not None and y is None:
            raise ValueError(
                f"This GAN is conditional (num_classes={self.num_classes}): expected batches of "
                "(samples, labels), received samples only. Fix: fit(x, labels)."
            )
        return x, (y if self.num_classes is not None else None)

    # -- sampling ------------------------------------------------------------

    def generate(self, n: int, labels: Sequence[int] | None = None, seed: int = 0) -> np.ndarray:
        """``n`` generated samples as a NumPy array (same ``seed``, same noise).

        Uses its own noise, so sampling does not change the training noise.

        Args:
            n: How many samples.
            labels: For a conditional GAN, ``n`` class labels (default
                ``0, 1, ..., num_classes - 1`` repeated).
            seed: Seed of the noise.
        """
        noise = random.normal((n, self.latent_dim), seed)
        label_tensor = None
        if self.num_classes is not None:
            classes = np.arange(n) % self.num_classes if labels is None else np.asarray(labels)
            label_tensor = tf.convert_to_tensor(classes.astype("int32"))
        return np.asarray(self.generator(self._generator_inputs(noise, label_tensor), training=False))
