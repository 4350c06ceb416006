"""Multi-model training code the way public Keras examples write it, condensed.

Each pattern is written once, against a base class passed in (``keras.Model``
or ``custom_fit.CustomModel``), with the structure of its keras.io original:
sub-models given to ``__init__`` and no ``get_config``; optimizers, losses and
settings given to a ``compile`` of its own and kept as attributes; metrics as
``keras.metrics.Mean`` trackers listed in a ``metrics`` property; a
``train_step`` with one tape per optimizer. Models are small MLPs on small
generated data so that every pattern trains in about a second.

Originals (keras.io examples, condensed and shrunk):

=================  ==========================================================
``dcgan``          "DCGAN to generate face images" / "customizing fit: GAN"
``wgan_gp``        "WGAN-GP overriding Model.train_step"
``conditional``    "Conditional GAN"
``cyclegan``       "CycleGAN" (two generators, two discriminators, 4 optimizers)
``vae``            "Variational AutoEncoder" (sampling layer, three trackers)
``distiller``      "Knowledge Distillation" (2021: compiled_metrics, no loss)
``simsiam``        "Self-supervised contrastive learning with SimSiam"
``barlow_twins``   "Barlow Twins for contrastive SSL"
``simclr``         "Semi-supervised image classification using contrastive
                   pretraining with SimCLR" (encoder, projection head and
                   linear probe as Sequentials without an input shape; two
                   optimizers)
``sam``            "Sharpness-Aware Minimization" (a model wrapping a model)
``trainer``        "Trainer pattern" (a keras.Model that trains another)
=================  ==========================================================

Random numbers come from a ``keras.random.SeedGenerator`` on Keras 3 (as the
Keras 3 originals do) and from ``tf.random`` on Keras 2 (as the Keras 2
originals did).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import custom_fit
from custom_fit import keras

FEATURES, LATENT, CLASSES = 8, 4, 3


def seed_generator(seed: int) -> Any:
    """A Keras 3 seed generator (``None`` on Keras 2, whose examples draw from ``tf.random``)."""
    return None if custom_fit.KERAS_2 else keras.random.SeedGenerator(seed)


def normal(shape: Any, generator: Any) -> Any:
    if custom_fit.KERAS_2:
        return tf.random.normal(shape)
    return keras.random.normal(shape, seed=generator)


def uniform(shape: Any, generator: Any) -> Any:
    if custom_fit.KERAS_2:
        return tf.random.uniform(shape)
    return keras.random.uniform(shape, seed=generator)


def mlp(inputs: int, units: list[int], name: str, activation: str | None = None) -> keras.Model:
    """A built Sequential: ``inputs`` -> Dense(relu) for all but the last of ``units`` -> Dense(last)."""
    layers: list[Any] = [keras.Input((inputs,))]
    layers += [keras.layers.Dense(u, activation="relu") for u in units[:-1]]
    layers.append(keras.layers.Dense(units[-1], activation=activation))
    return keras.Sequential(layers, name=name)


def vectors(n: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, FEATURES)).astype("float32")


def labels(n: int = 64, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 1).integers(0, CLASSES, size=n).astype("int32")


# --------------------------------------------------------------------------
# Layers that draw from a global random state
# --------------------------------------------------------------------------


def _keras_unseeded_normal(shape: Any) -> Any:
    if custom_fit.KERAS_2:  # the 2020 keras.io VAE's Sampling layer: its op seed comes from NumPy, at trace time
        return tf.keras.backend.random_normal(shape)
    return keras.random.normal(shape)  # Keras 3 without a seed: Keras' global seed generator


#: How a layer draws noise without a seed generator of its own, as older keras.io examples do.
GLOBAL_DRAWS: dict[str, Callable[[Any], Any]] = {
    "tf.random.normal": lambda shape: tf.random.normal(shape),  # op seeds derived from the global seed
    "keras unseeded normal": _keras_unseeded_normal,
}


# --------------------------------------------------------------------------
# GANs
# --------------------------------------------------------------------------


def dcgan(base: type, draw: str | None = None) -> dict[str, Any]:
    """The customizing-fit GAN; with ``draw``, noise from the global random state (``GLOBAL_DRAWS[draw]``).

    With ``draw`` the latent vectors come from ``GLOBAL_DRAWS[draw]``, and
    the generator adds instance noise from it in an ``InstanceNoise`` layer.
    """

    def latent_vectors(shape: Any, generator: Any) -> Any:
        return normal(shape, generator) if draw is None else GLOBAL_DRAWS[draw](shape)

    class InstanceNoise(keras.layers.Layer):  # in the generator when `draw` is given
        def call(self, inputs):
            return inputs + 0.1 * latent_vectors(tf.shape(inputs), None)

    class GAN(base):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.seed_generator = seed_generator(1337)

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn
            self.d_loss_metric = keras.metrics.Mean(name="d_loss")
            self.g_loss_metric = keras.metrics.Mean(name="g_loss")

        @property
        def metrics(self):
            return [self.d_loss_metric, self.g_loss_metric]

        def train_step(self, real_images):
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = latent_vectors((batch_size, self.latent_dim), self.seed_generator)
            generated_images = self.generator(random_latent_vectors)
            combined_images = tf.concat([generated_images, real_images], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
            labels += 0.05 * uniform(tf.shape(labels), self.seed_generator)
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            random_latent_vectors = latent_vectors((batch_size, self.latent_dim), self.seed_generator)
            misleading_labels = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.d_loss_metric.update_state(d_loss)
            self.g_loss_metric.update_state(g_loss)
            return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}

    def generator() -> keras.Model:
        if draw is None:
            return mlp(LATENT, [16, FEATURES], "generator")
        layers = [keras.Input((LATENT,)), keras.layers.Dense(16, activation="relu"), InstanceNoise()]
        return keras.Sequential([*layers, keras.layers.Dense(FEATURES)], name="generator")

    return dict(
        cls=GAN,
        make=lambda: GAN(mlp(FEATURES, [16, 1], "discriminator"), generator(), LATENT),
        compile=lambda: dict(
            d_optimizer=keras.optimizers.Adam(3e-4),
            g_optimizer=keras.optimizers.Adam(3e-4),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        ),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=("d_optimizer", "g_optimizer"),
        custom_objects={"InstanceNoise": InstanceNoise},
    )


def wgan_gp(base: type) -> dict[str, Any]:
    def discriminator_loss(real_img, fake_img):
        return tf.reduce_mean(fake_img) - tf.reduce_mean(real_img)

    def generator_loss(fake_img):
        return -tf.reduce_mean(fake_img)

    class WGAN(base):
        def __init__(self, discriminator, generator, latent_dim, discriminator_extra_steps=3, gp_weight=10.0):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_steps = discriminator_extra_steps
            self.gp_weight = gp_weight
            self.seed_generator = seed_generator(7)

        def compile(self, d_optimizer, g_optimizer, d_loss_fn, g_loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.d_loss_fn = d_loss_fn
            self.g_loss_fn = g_loss_fn

        def gradient_penalty(self, batch_size, real_images, fake_images):
            alpha = normal((batch_size, 1), self.seed_generator)
            interpolated = real_images + alpha * (fake_images - real_images)
            with tf.GradientTape() as gp_tape:
                gp_tape.watch(interpolated)
                pred = self.discriminator(interpolated, training=True)
            grads = gp_tape.gradient(pred, [interpolated])[0]
            norm = tf.sqrt(tf.reduce_sum(tf.square(grads), axis=[1]))
            return tf.reduce_mean((norm - 1.0) ** 2)

        def train_step(self, real_images):
            batch_size = tf.shape(real_images)[0]
            for _ in range(self.d_steps):
                random_latent_vectors = normal((batch_size, self.latent_dim), self.seed_generator)
                with tf.GradientTape() as tape:
                    fake_images = self.generator(random_latent_vectors, training=True)
                    fake_logits = self.discriminator(fake_images, training=True)
                    real_logits = self.discriminator(real_images, training=True)
                    d_cost = self.d_loss_fn(real_img=real_logits, fake_img=fake_logits)
                    gp = self.gradient_penalty(batch_size, real_images, fake_images)
                    d_loss = d_cost + gp * self.gp_weight
                d_gradient = tape.gradient(d_loss, self.discriminator.trainable_variables)
                self.d_optimizer.apply_gradients(zip(d_gradient, self.discriminator.trainable_variables))
            random_latent_vectors = normal((batch_size, self.latent_dim), self.seed_generator)
            with tf.GradientTape() as tape:
                generated_images = self.generator(random_latent_vectors, training=True)
                gen_img_logits = self.discriminator(generated_images, training=True)
                g_loss = self.g_loss_fn(gen_img_logits)
            gen_gradient = tape.gradient(g_loss, self.generator.trainable_variables)
            self.g_optimizer.apply_gradients(zip(gen_gradient, self.generator.trainable_variables))
            return {"d_loss": d_loss, "g_loss": g_loss}

    return dict(
        cls=WGAN,
        make=lambda: WGAN(mlp(FEATURES, [16, 1], "critic"), mlp(LATENT, [16, FEATURES], "generator"), LATENT),
        compile=lambda: dict(
            d_optimizer=keras.optimizers.Adam(1e-4, beta_1=0.5, beta_2=0.9),
            g_optimizer=keras.optimizers.Adam(1e-4, beta_1=0.5, beta_2=0.9),
            d_loss_fn=discriminator_loss,
            g_loss_fn=generator_loss,
        ),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=("d_optimizer", "g_optimizer"),
        custom_objects={"discriminator_loss": discriminator_loss, "generator_loss": generator_loss},
    )


def conditional(base: type) -> dict[str, Any]:
    class ConditionalGAN(base):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.seed_generator = seed_generator(1337)
            self.gen_loss_tracker = keras.metrics.Mean(name="generator_loss")
            self.disc_loss_tracker = keras.metrics.Mean(name="discriminator_loss")

        @property
        def metrics(self):
            return [self.gen_loss_tracker, self.disc_loss_tracker]

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        def train_step(self, data):
            real_images, one_hot_labels = data
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = normal((batch_size, self.latent_dim), self.seed_generator)
            generated_images = self.generator(tf.concat([random_latent_vectors, one_hot_labels], axis=1))
            fake_image_and_labels = tf.concat([generated_images, one_hot_labels], -1)
            real_image_and_labels = tf.concat([real_images, one_hot_labels], -1)
            combined_images = tf.concat([fake_image_and_labels, real_image_and_labels], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            random_latent_vectors = normal((batch_size, self.latent_dim), self.seed_generator)
            random_vector_labels = tf.concat([random_latent_vectors, one_hot_labels], axis=1)
            misleading_labels = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                fake_images = self.generator(random_vector_labels)
                predictions = self.discriminator(tf.concat([fake_images, one_hot_labels], -1))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.gen_loss_tracker.update_state(g_loss)
            self.disc_loss_tracker.update_state(d_loss)
            return {"g_loss": self.gen_loss_tracker.result(), "d_loss": self.disc_loss_tracker.result()}

    return dict(
        cls=ConditionalGAN,
        make=lambda: ConditionalGAN(
            mlp(FEATURES + CLASSES, [16, 1], "discriminator"),
            mlp(LATENT + CLASSES, [16, FEATURES], "generator"),
            LATENT,
        ),
        compile=lambda: dict(
            d_optimizer=keras.optimizers.Adam(3e-4),
            g_optimizer=keras.optimizers.Adam(3e-4),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        ),
        fit=lambda: dict(x=vectors(), y=np.eye(CLASSES, dtype="float32")[labels()], batch_size=16),
        optimizers=("d_optimizer", "g_optimizer"),
    )


def cyclegan(base: type) -> dict[str, Any]:
    class CycleGan(base):
        def __init__(
            self, generator_G, generator_F, discriminator_X, discriminator_Y, lambda_cycle=10.0, lambda_identity=0.5
        ):
            super().__init__()
            self.gen_G = generator_G
            self.gen_F = generator_F
            self.disc_X = discriminator_X
            self.disc_Y = discriminator_Y
            self.lambda_cycle = lambda_cycle
            self.lambda_identity = lambda_identity

        def call(self, inputs):
            return (self.disc_X(inputs), self.disc_Y(inputs), self.gen_G(inputs), self.gen_F(inputs))

        def compile(
            self, gen_G_optimizer, gen_F_optimizer, disc_X_optimizer, disc_Y_optimizer, gen_loss_fn, disc_loss_fn
        ):
            super().compile()
            self.gen_G_optimizer = gen_G_optimizer
            self.gen_F_optimizer = gen_F_optimizer
            self.disc_X_optimizer = disc_X_optimizer
            self.disc_Y_optimizer = disc_Y_optimizer
            self.generator_loss_fn = gen_loss_fn
            self.discriminator_loss_fn = disc_loss_fn
            self.cycle_loss_fn = keras.losses.MeanAbsoluteError()
            self.identity_loss_fn = keras.losses.MeanAbsoluteError()

        def train_step(self, batch_data):
            real_x, real_y = batch_data
            with tf.GradientTape(persistent=True) as tape:
                fake_y = self.gen_G(real_x, training=True)
                fake_x = self.gen_F(real_y, training=True)
                cycled_x = self.gen_F(fake_y, training=True)
                cycled_y = self.gen_G(fake_x, training=True)
                same_x = self.gen_F(real_x, training=True)
                same_y = self.gen_G(real_y, training=True)
                disc_real_x = self.disc_X(real_x, training=True)
                disc_fake_x = self.disc_X(fake_x, training=True)
                disc_real_y = self.disc_Y(real_y, training=True)
                disc_fake_y = self.disc_Y(fake_y, training=True)
                gen_G_loss = self.generator_loss_fn(disc_fake_y)
                gen_F_loss = self.generator_loss_fn(disc_fake_x)
                cycle_loss_G = self.cycle_loss_fn(real_y, cycled_y) * self.lambda_cycle
                cycle_loss_F = self.cycle_loss_fn(real_x, cycled_x) * self.lambda_cycle
                id_loss_G = self.identity_loss_fn(real_y, same_y) * self.lambda_cycle * self.lambda_identity
                id_loss_F = self.identity_loss_fn(real_x, same_x) * self.lambda_cycle * self.lambda_identity
                total_loss_G = gen_G_loss + cycle_loss_G + id_loss_G
                total_loss_F = gen_F_loss + cycle_loss_F + id_loss_F
                disc_X_loss = self.discriminator_loss_fn(disc_real_x, disc_fake_x)
                disc_Y_loss = self.discriminator_loss_fn(disc_real_y, disc_fake_y)
            grads_G = tape.gradient(total_loss_G, self.gen_G.trainable_variables)
            grads_F = tape.gradient(total_loss_F, self.gen_F.trainable_variables)
            disc_X_grads = tape.gradient(disc_X_loss, self.disc_X.trainable_variables)
            disc_Y_grads = tape.gradient(disc_Y_loss, self.disc_Y.trainable_variables)
            self.gen_G_optimizer.apply_gradients(zip(grads_G, self.gen_G.trainable_variables))
            self.gen_F_optimizer.apply_gradients(zip(grads_F, self.gen_F.trainable_variables))
            self.disc_X_optimizer.apply_gradients(zip(disc_X_grads, self.disc_X.trainable_variables))
            self.disc_Y_optimizer.apply_gradients(zip(disc_Y_grads, self.disc_Y.trainable_variables))
            return {"G_loss": total_loss_G, "F_loss": total_loss_F, "D_X_loss": disc_X_loss, "D_Y_loss": disc_Y_loss}

    def generator_loss_fn(fake):
        return keras.losses.MeanSquaredError()(tf.ones_like(fake), fake)

    def discriminator_loss_fn(real, fake):
        mse = keras.losses.MeanSquaredError()
        return (mse(tf.ones_like(real), real) + mse(tf.zeros_like(fake), fake)) * 0.5

    return dict(
        cls=CycleGan,
        make=lambda: CycleGan(
            mlp(FEATURES, [16, FEATURES], "generator_G"),
            mlp(FEATURES, [16, FEATURES], "generator_F"),
            mlp(FEATURES, [16, 1], "discriminator_X"),
            mlp(FEATURES, [16, 1], "discriminator_Y"),
        ),
        compile=lambda: dict(
            gen_G_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
            gen_F_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
            disc_X_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
            disc_Y_optimizer=keras.optimizers.Adam(2e-4, beta_1=0.5),
            gen_loss_fn=generator_loss_fn,
            disc_loss_fn=discriminator_loss_fn,
        ),
        fit=lambda: dict(x=vectors(seed=0), y=vectors(seed=1) + 1.0, batch_size=16),
        optimizers=("gen_G_optimizer", "gen_F_optimizer", "disc_X_optimizer", "disc_Y_optimizer"),
        custom_objects={"generator_loss_fn": generator_loss_fn, "discriminator_loss_fn": discriminator_loss_fn},
    )


# --------------------------------------------------------------------------
# One optimizer, several sub-models or losses
# --------------------------------------------------------------------------


def vae(base: type) -> dict[str, Any]:
    class Sampling(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.seed_generator = seed_generator(1337)

        def call(self, inputs):
            z_mean, z_log_var = inputs
            epsilon = normal(tf.shape(z_mean), self.seed_generator)
            return z_mean + tf.exp(0.5 * z_log_var) * epsilon

    class VAE(base):
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.sampling = Sampling()
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

        def train_step(self, data):
            with tf.GradientTape() as tape:
                z_mean, z_log_var = tf.split(self.encoder(data), 2, axis=-1)
                z = self.sampling([z_mean, z_log_var])
                reconstruction = self.decoder(z)
                reconstruction_loss = tf.reduce_mean(tf.reduce_sum(tf.square(data - reconstruction), axis=1))
                kl_loss = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
                kl_loss = tf.reduce_mean(tf.reduce_sum(kl_loss, axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {
                "loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result(),
            }

    return dict(
        cls=VAE,
        make=lambda: VAE(mlp(FEATURES, [16, 2 * LATENT], "encoder"), mlp(LATENT, [16, FEATURES], "decoder")),
        compile=lambda: dict(optimizer=keras.optimizers.Adam(1e-3)),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=(),
        custom_objects={"Sampling": Sampling},
    )


def distiller(base: type) -> dict[str, Any]:
    class Distiller(base):
        def __init__(self, student, teacher):
            super().__init__()
            self.teacher = teacher
            self.student = student

        def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3):
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn
            self.alpha = alpha
            self.temperature = temperature

        def train_step(self, data):
            x, y = data
            teacher_predictions = self.teacher(x, training=False)
            with tf.GradientTape() as tape:
                student_predictions = self.student(x, training=True)
                student_loss = self.student_loss_fn(y, student_predictions)
                distillation_loss = self.distillation_loss_fn(
                    tf.nn.softmax(teacher_predictions / self.temperature, axis=1),
                    tf.nn.softmax(student_predictions / self.temperature, axis=1),
                )
                loss = self.alpha * student_loss + (1 - self.alpha) * distillation_loss
            trainable_vars = self.student.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            self.compiled_metrics.update_state(y, student_predictions)
            results = {m.name: m.result() for m in self.metrics}
            results.update({"student_loss": student_loss, "distillation_loss": distillation_loss})
            return results

        def test_step(self, data):
            x, y = data
            y_prediction = self.student(x, training=False)
            student_loss = self.student_loss_fn(y, y_prediction)
            self.compiled_metrics.update_state(y, y_prediction)
            results = {m.name: m.result() for m in self.metrics}
            results.update({"student_loss": student_loss})
            return results

    return dict(
        cls=Distiller,
        make=lambda: Distiller(
            student=mlp(FEATURES, [8, CLASSES], "student"), teacher=mlp(FEATURES, [32, CLASSES], "teacher")
        ),
        compile=lambda: dict(
            optimizer=keras.optimizers.Adam(),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
            student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            distillation_loss_fn=keras.losses.KLDivergence(),
            alpha=0.1,
            temperature=10,
        ),
        fit=lambda: dict(x=vectors(), y=labels(), batch_size=16, validation_data=(vectors(seed=5), labels(seed=5))),
        optimizers=(),
    )


def simsiam(base: type) -> dict[str, Any]:
    def compute_loss(p, z):
        z = tf.stop_gradient(z)
        p = tf.math.l2_normalize(p, axis=1)
        z = tf.math.l2_normalize(z, axis=1)
        return -tf.reduce_mean(tf.reduce_sum((p * z), axis=1))

    class SimSiam(base):
        def __init__(self, encoder, predictor):
            super().__init__()
            self.encoder = encoder
            self.predictor = predictor
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.seed_generator = seed_generator(3)

        @property
        def metrics(self):
            return [self.loss_tracker]

        def train_step(self, data):
            ds_one = data + 0.1 * normal(tf.shape(data), self.seed_generator)
            ds_two = data + 0.1 * normal(tf.shape(data), self.seed_generator)
            with tf.GradientTape() as tape:
                z1, z2 = self.encoder(ds_one), self.encoder(ds_two)
                p1, p2 = self.predictor(z1), self.predictor(z2)
                loss = compute_loss(p1, z2) / 2 + compute_loss(p2, z1) / 2
            learnable_params = self.encoder.trainable_variables + self.predictor.trainable_variables
            gradients = tape.gradient(loss, learnable_params)
            self.optimizer.apply_gradients(zip(gradients, learnable_params))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    return dict(
        cls=SimSiam,
        make=lambda: SimSiam(mlp(FEATURES, [16, 8], "encoder"), mlp(8, [4, 8], "predictor")),
        compile=lambda: dict(optimizer=keras.optimizers.SGD(0.05, momentum=0.6)),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=(),
    )


def barlow_twins(base: type) -> dict[str, Any]:
    class BarlowModel(base):
        def __init__(self, encoder, lambda_amt=5e-3):
            super().__init__()
            self.model = encoder
            self.lambda_amt = lambda_amt
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.seed_generator = seed_generator(11)

        @property
        def metrics(self):
            return [self.loss_tracker]

        def barlow_loss(self, z_a, z_b):
            batch = tf.cast(tf.shape(z_a)[0], z_a.dtype)
            z_a = (z_a - tf.reduce_mean(z_a, axis=0)) / (tf.math.reduce_std(z_a, axis=0) + 1e-6)
            z_b = (z_b - tf.reduce_mean(z_b, axis=0)) / (tf.math.reduce_std(z_b, axis=0) + 1e-6)
            c = tf.matmul(z_a, z_b, transpose_a=True) / batch
            on_diag = tf.reduce_sum(tf.square(tf.linalg.diag_part(c) - 1.0))
            off_diag = tf.reduce_sum(tf.square(c - tf.linalg.diag(tf.linalg.diag_part(c))))
            return on_diag + self.lambda_amt * off_diag

        def train_step(self, batch):
            y_a = batch + 0.1 * normal(tf.shape(batch), self.seed_generator)
            y_b = batch + 0.1 * normal(tf.shape(batch), self.seed_generator)
            with tf.GradientTape() as tape:
                loss = self.barlow_loss(self.model(y_a, training=True), self.model(y_b, training=True))
            grads_model = tape.gradient(loss, self.model.trainable_variables)
            self.optimizer.apply_gradients(zip(grads_model, self.model.trainable_variables))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

    return dict(
        cls=BarlowModel,
        make=lambda: BarlowModel(mlp(FEATURES, [16, 8], "encoder")),
        compile=lambda: dict(optimizer=keras.optimizers.Adam(1e-3)),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=(),
    )


def simclr(base: type) -> dict[str, Any]:
    """Sub-models written as Sequentials without an input shape (built by their first call)."""

    class ContrastiveModel(base):
        def __init__(self, temperature=0.1):
            super().__init__()
            self.temperature = temperature
            self.encoder = keras.Sequential([keras.layers.Dense(16, activation="relu")], name="encoder")
            self.projection_head = keras.Sequential(
                [keras.layers.Dense(8, activation="relu"), keras.layers.Dense(8)], name="projection_head"
            )
            self.linear_probe = keras.Sequential([keras.layers.Dense(CLASSES)], name="linear_probe")
            self.seed_generator = seed_generator(5)

        def compile(self, contrastive_optimizer, probe_optimizer, **kwargs):
            super().compile(**kwargs)
            self.contrastive_optimizer = contrastive_optimizer
            self.probe_optimizer = probe_optimizer
            self.contrastive_loss_tracker = keras.metrics.Mean(name="c_loss")
            self.probe_loss_tracker = keras.metrics.Mean(name="p_loss")
            self.probe_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

        @property
        def metrics(self):
            return [self.contrastive_loss_tracker, self.probe_loss_tracker]

        def contrastive_loss(self, projections_1, projections_2):
            projections_1 = tf.math.l2_normalize(projections_1, axis=1)
            projections_2 = tf.math.l2_normalize(projections_2, axis=1)
            similarities = tf.matmul(projections_1, projections_2, transpose_b=True) / self.temperature
            batch_size = tf.shape(projections_1)[0]
            contrastive_labels = tf.range(batch_size)
            loss_1_2 = keras.losses.sparse_categorical_crossentropy(contrastive_labels, similarities, from_logits=True)
            loss_2_1 = keras.losses.sparse_categorical_crossentropy(
                contrastive_labels, tf.transpose(similarities), from_logits=True
            )
            return (loss_1_2 + loss_2_1) / 2

        def train_step(self, data):
            images, labels = data
            augmented_1 = images + 0.1 * normal(tf.shape(images), self.seed_generator)
            augmented_2 = images + 0.1 * normal(tf.shape(images), self.seed_generator)
            with tf.GradientTape() as tape:
                projections_1 = self.projection_head(self.encoder(augmented_1, training=True), training=True)
                projections_2 = self.projection_head(self.encoder(augmented_2, training=True), training=True)
                contrastive_loss = tf.reduce_mean(self.contrastive_loss(projections_1, projections_2))
            variables = self.encoder.trainable_weights + self.projection_head.trainable_weights
            gradients = tape.gradient(contrastive_loss, variables)
            self.contrastive_optimizer.apply_gradients(zip(gradients, variables))
            self.contrastive_loss_tracker.update_state(contrastive_loss)
            features = self.encoder(images, training=False)
            with tf.GradientTape() as tape:
                class_logits = self.linear_probe(features, training=True)
                probe_loss = self.probe_loss(labels, class_logits)
            gradients = tape.gradient(probe_loss, self.linear_probe.trainable_weights)
            self.probe_optimizer.apply_gradients(zip(gradients, self.linear_probe.trainable_weights))
            self.probe_loss_tracker.update_state(probe_loss)
            return {m.name: m.result() for m in self.metrics}

    return dict(
        cls=ContrastiveModel,
        make=lambda: ContrastiveModel(),
        compile=lambda: dict(contrastive_optimizer=keras.optimizers.Adam(), probe_optimizer=keras.optimizers.Adam()),
        fit=lambda: dict(x=vectors(), y=labels(), batch_size=16),
        optimizers=("contrastive_optimizer", "probe_optimizer"),
    )


def sam(base: type) -> dict[str, Any]:
    class SAMModel(base):
        def __init__(self, resnet_model, rho=0.05):
            super().__init__()
            self.resnet_model = resnet_model
            self.rho = rho

        def train_step(self, data):
            (images, labels) = data
            e_ws = []
            with tf.GradientTape() as tape:
                predictions = self.resnet_model(images)
                loss = self.compiled_loss(labels, predictions)
            trainable_params = self.resnet_model.trainable_variables
            gradients = tape.gradient(loss, trainable_params)
            grad_norm = tf.linalg.global_norm(gradients)
            scale = self.rho / (grad_norm + 1e-12)
            for grad, param in zip(gradients, trainable_params):
                e_w = grad * scale
                param.assign_add(e_w)
                e_ws.append(e_w)
            with tf.GradientTape() as tape:
                predictions = self.resnet_model(images)
                loss = self.compiled_loss(labels, predictions)
            sam_gradients = tape.gradient(loss, trainable_params)
            for param, e_w in zip(trainable_params, e_ws):
                param.assign_sub(e_w)
            self.optimizer.apply_gradients(zip(sam_gradients, trainable_params))
            self.compiled_metrics.update_state(labels, predictions)
            return {m.name: m.result() for m in self.metrics}

        def test_step(self, data):
            (images, labels) = data
            predictions = self.resnet_model(images, training=False)
            self.compiled_loss(labels, predictions)
            self.compiled_metrics.update_state(labels, predictions)
            return {m.name: m.result() for m in self.metrics}

        def call(self, images):
            return self.resnet_model(images)

    return dict(
        cls=SAMModel,
        make=lambda: SAMModel(mlp(FEATURES, [16, CLASSES], "classifier")),
        compile=lambda: dict(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        ),
        fit=lambda: dict(x=vectors(), y=labels(), batch_size=16, validation_data=(vectors(seed=5), labels(seed=5))),
        optimizers=(),
    )


def trainer(base: type) -> dict[str, Any]:
    class MyTrainer(base):
        def __init__(self, model):
            super().__init__()
            self.model = model
            self.loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            self.accuracy_metric = keras.metrics.SparseCategoricalAccuracy()

        @property
        def metrics(self):
            return [self.accuracy_metric]

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self.model(x, training=True)
                loss = self.loss_fn(y, y_pred)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            for metric in self.metrics:
                metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

        def call(self, x):
            return self.model(x)

    return dict(
        cls=MyTrainer,
        make=lambda: MyTrainer(mlp(FEATURES, [16, CLASSES], "classifier")),
        compile=lambda: dict(optimizer=keras.optimizers.SGD(0.1)),
        fit=lambda: dict(x=vectors(), y=labels(), batch_size=16),
        optimizers=(),
    )


def sampling_vae(base: type, draw: str) -> dict[str, Any]:
    """The 2020 keras.io VAE: a ``Sampling`` layer inside the functional encoder, one compiled optimizer.

    ``Sampling`` draws its noise from the global random state with ``GLOBAL_DRAWS[draw]``.
    """
    normal_noise = GLOBAL_DRAWS[draw]

    class Sampling(keras.layers.Layer):
        def call(self, inputs):
            z_mean, z_log_var = inputs
            epsilon = normal_noise((tf.shape(z_mean)[0], tf.shape(z_mean)[1]))
            return z_mean + tf.exp(0.5 * z_log_var) * epsilon

    class VAE(base):
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder = encoder
            self.decoder = decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker, self.kl_loss_tracker]

        def train_step(self, data):
            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder(data)
                reconstruction = self.decoder(z)
                reconstruction_loss = tf.reduce_mean(tf.reduce_sum(tf.square(data - reconstruction), axis=1))
                kl_loss = -0.5 * (1 + z_log_var - tf.square(z_mean) - tf.exp(z_log_var))
                kl_loss = tf.reduce_mean(tf.reduce_sum(kl_loss, axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {"loss": self.total_loss_tracker.result(), "kl_loss": self.kl_loss_tracker.result()}

    def encoder() -> keras.Model:
        inputs = keras.Input((FEATURES,))
        hidden = keras.layers.Dense(16, activation="relu")(inputs)
        z_mean = keras.layers.Dense(LATENT, name="z_mean")(hidden)
        z_log_var = keras.layers.Dense(LATENT, name="z_log_var")(hidden)
        return keras.Model(inputs, [z_mean, z_log_var, Sampling()([z_mean, z_log_var])], name="encoder")

    return dict(
        cls=VAE,
        make=lambda: VAE(encoder(), mlp(LATENT, [16, FEATURES], "decoder")),
        compile=lambda: dict(optimizer=keras.optimizers.Adam()),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=(),
        custom_objects={"Sampling": Sampling},
    )


#: Models whose layers draw from the global random state (``GLOBAL_DRAWS``), by name.
GLOBAL_DRAW_MODELS = {"dcgan": dcgan, "sampling_vae": sampling_vae}


# --------------------------------------------------------------------------
# More existing code: run under tf.distribute strategies (tests/strategy_cases.py)
# --------------------------------------------------------------------------


def guide_keras3(base: type) -> dict[str, Any]:
    """The customizing-fit guide's step, Keras 3 style (``compute_loss``, metrics updated by hand)."""

    class GuideModel(base):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    def make():
        inputs = keras.Input((FEATURES,))
        return GuideModel(inputs, keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs)))

    return dict(
        cls=GuideModel,
        make=make,
        compile=lambda: dict(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"]),
        fit=lambda: dict(x=vectors(), y=vectors(seed=3)[:, :1], batch_size=16),
        optimizers=(),
    )


def guide_keras2(base: type) -> dict[str, Any]:
    """The customizing-fit guide's step, Keras 2 style (``compiled_loss``, ``compiled_metrics``)."""

    class GuideModel(base):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            self.compiled_metrics.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    def make():
        inputs = keras.Input((FEATURES,))
        return GuideModel(inputs, keras.layers.Dense(1)(keras.layers.Dense(16, activation="relu")(inputs)))

    return dict(
        cls=GuideModel,
        make=make,
        compile=lambda: dict(optimizer=keras.optimizers.Adam(1e-2), loss="mse", metrics=["mae"]),
        fit=lambda: dict(x=vectors(), y=vectors(seed=3)[:, :1], batch_size=16),
        optimizers=(),
    )


def guide_gan_keras2(base: type) -> dict[str, Any]:
    """The TF 2 guide's GAN: noise from ``tf.random``, the last batch's losses returned as they are."""

    class GAN(base):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        def train_step(self, real_images):
            if isinstance(real_images, tuple):
                real_images = real_images[0]
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))
            generated_images = self.generator(random_latent_vectors)
            combined_images = tf.concat([generated_images, real_images], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
            labels += 0.05 * tf.random.uniform(tf.shape(labels))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            random_latent_vectors = tf.random.normal(shape=(batch_size, self.latent_dim))
            misleading_labels = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            return {"d_loss": d_loss, "g_loss": g_loss}

    return dict(
        cls=GAN,
        make=lambda: GAN(mlp(FEATURES, [16, 1], "discriminator"), mlp(LATENT, [16, FEATURES], "generator"), LATENT),
        compile=lambda: dict(
            d_optimizer=keras.optimizers.Adam(3e-4),
            g_optimizer=keras.optimizers.Adam(3e-4),
            loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
        ),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=("d_optimizer", "g_optimizer"),
    )


def dcgan_conv(base: type) -> dict[str, Any]:
    """``dcgan``'s step with convolutional sub-models on 4x4 one-channel images."""
    pattern = dcgan(base)

    def make():
        discriminator = keras.Sequential(
            [
                keras.Input((4, 4, 1)),
                keras.layers.Conv2D(4, 3, strides=2, padding="same"),
                keras.layers.LeakyReLU(negative_slope=0.2) if not custom_fit.KERAS_2 else keras.layers.LeakyReLU(0.2),
                keras.layers.Flatten(),
                keras.layers.Dense(1),
            ],
            name="discriminator",
        )
        generator = keras.Sequential(
            [
                keras.Input((LATENT,)),
                keras.layers.Dense(2 * 2 * 4),
                keras.layers.Reshape((2, 2, 4)),
                keras.layers.Conv2DTranspose(4, 3, strides=2, padding="same", activation="relu"),
                keras.layers.Conv2D(1, 3, padding="same", activation="tanh"),
            ],
            name="generator",
        )
        return pattern["cls"](discriminator, generator, LATENT)

    images = lambda: np.tanh(vectors(64, seed=4)[:, :4].repeat(4, axis=1).reshape(64, 4, 4, 1))  # noqa: E731
    return {**pattern, "make": make, "fit": lambda: dict(x=images(), batch_size=16)}


def self_trainer(base: type) -> dict[str, Any]:
    """keras.io "Consistency training with supervision": a student trained on noisy views against a teacher."""

    class SelfTrainer(base):
        def __init__(self, student, teacher):
            super().__init__()
            self.student = student
            self.teacher = teacher

        def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, temperature=3):
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn = student_loss_fn
            self.distillation_loss_fn = distillation_loss_fn
            self.temperature = temperature

        def train_step(self, data):
            clean_ds, noisy_ds = data
            clean_images, _ = clean_ds
            noisy_images, y = noisy_ds
            teacher_predictions = self.teacher(clean_images, training=False)
            with tf.GradientTape() as tape:
                student_predictions = self.student(noisy_images, training=True)
                student_loss = self.student_loss_fn(y, student_predictions)
                distillation_loss = self.distillation_loss_fn(
                    tf.nn.softmax(teacher_predictions / self.temperature, axis=1),
                    tf.nn.softmax(student_predictions / self.temperature, axis=1),
                )
                total_loss = (student_loss + distillation_loss) / 2
            trainable_vars = self.student.trainable_variables
            gradients = tape.gradient(total_loss, trainable_vars)
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            self.compiled_metrics.update_state(y, tf.nn.softmax(student_predictions, axis=1))
            results = {m.name: m.result() for m in self.metrics}
            results.update({"total_loss": total_loss})
            return results

    def dataset():
        x, y = vectors(), labels()
        noisy = x + 0.1 * np.random.default_rng(9).normal(size=x.shape).astype("float32")
        clean_ds = tf.data.Dataset.from_tensor_slices((x, y))
        noisy_ds = tf.data.Dataset.from_tensor_slices((noisy, y))
        return tf.data.Dataset.zip((clean_ds, noisy_ds)).batch(16)

    return dict(
        cls=SelfTrainer,
        make=lambda: SelfTrainer(
            student=mlp(FEATURES, [8, CLASSES], "student"), teacher=mlp(FEATURES, [32, CLASSES], "teacher")
        ),
        compile=lambda: dict(
            optimizer=keras.optimizers.Adam(),
            metrics=[keras.metrics.SparseCategoricalAccuracy()],
            student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            distillation_loss_fn=keras.losses.KLDivergence(),
            temperature=10,
        ),
        fit=lambda: dict(x=dataset()),
        optimizers=(),
    )


def masked_autoencoder(base: type) -> dict[str, Any]:
    """keras.io "Masked image modeling with Autoencoders": no ``call``; the patch encoder is built by the step.

    The mask token is a raw ``tf.Variable`` created in ``__init__``, as in the
    original (Keras 3 does not track it, so it is not trained there).
    """
    patches, patch_area, projection = 4, 2, 8

    class Patches(keras.layers.Layer):
        def call(self, images):
            return tf.reshape(images, (-1, patches, patch_area))

    class PatchEncoder(keras.layers.Layer):
        def __init__(self, mask_proportion=0.5, **kwargs):
            super().__init__(**kwargs)
            self.mask_proportion = mask_proportion
            self.mask_token = tf.Variable(tf.random.normal([1, patch_area]), trainable=True)

        def build(self, input_shape):
            (_, self.num_patches, self.patch_area) = input_shape
            self.projection = keras.layers.Dense(units=projection)
            self.position_embedding = keras.layers.Embedding(input_dim=self.num_patches, output_dim=projection)
            self.num_mask = int(self.mask_proportion * self.num_patches)

        def call(self, patches):
            batch_size = tf.shape(patches)[0]
            positions = tf.range(start=0, limit=self.num_patches, delta=1)
            pos_embeddings = tf.tile(self.position_embedding(positions[tf.newaxis, ...]), [batch_size, 1, 1])
            patch_embeddings = self.projection(patches) + pos_embeddings
            rand_indices = tf.argsort(tf.random.uniform(shape=(batch_size, self.num_patches)), axis=-1)
            mask_indices = rand_indices[:, : self.num_mask]
            unmask_indices = rand_indices[:, self.num_mask :]
            unmasked_embeddings = tf.gather(patch_embeddings, unmask_indices, axis=1, batch_dims=1)
            unmasked_positions = tf.gather(pos_embeddings, unmask_indices, axis=1, batch_dims=1)
            masked_positions = tf.gather(pos_embeddings, mask_indices, axis=1, batch_dims=1)
            mask_tokens = tf.repeat(self.mask_token, repeats=self.num_mask, axis=0)
            mask_tokens = tf.repeat(mask_tokens[tf.newaxis, ...], repeats=batch_size, axis=0)
            masked_embeddings = self.projection(mask_tokens) + masked_positions
            return unmasked_embeddings, masked_embeddings, unmasked_positions, mask_indices, unmask_indices

    class MaskedAutoencoder(base):
        def __init__(self, patch_layer, patch_encoder, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.patch_layer = patch_layer
            self.patch_encoder = patch_encoder
            self.encoder = encoder
            self.decoder = decoder

        def calculate_loss(self, images, test=False):
            patches = self.patch_layer(images)
            unmasked_embeddings, masked_embeddings, unmasked_positions, mask_indices, _ = self.patch_encoder(patches)
            encoder_outputs = self.encoder(unmasked_embeddings) + unmasked_positions
            decoder_inputs = tf.concat([encoder_outputs, masked_embeddings], axis=1)
            decoder_patches = self.patch_layer(self.decoder(decoder_inputs))
            loss_patch = tf.gather(patches, mask_indices, axis=1, batch_dims=1)
            loss_output = tf.gather(decoder_patches, mask_indices, axis=1, batch_dims=1)
            total_loss = self.compiled_loss(loss_patch, loss_output)
            return total_loss, loss_patch, loss_output

        def train_step(self, images):
            with tf.GradientTape() as tape:
                total_loss, loss_patch, loss_output = self.calculate_loss(images)
            train_vars = [
                self.patch_layer.trainable_variables,
                self.patch_encoder.trainable_variables,
                self.encoder.trainable_variables,
                self.decoder.trainable_variables,
            ]
            grads = tape.gradient(total_loss, train_vars)
            tv_list = []
            for grad, var in zip(grads, train_vars):
                for g, v in zip(grad, var):
                    tv_list.append((g, v))
            self.optimizer.apply_gradients(tv_list)
            self.compiled_metrics.update_state(loss_patch, loss_output)
            return {m.name: m.result() for m in self.metrics}

    def make():
        encoder_inputs = keras.Input((None, projection))
        encoder = keras.Model(encoder_inputs, keras.layers.Dense(projection, activation="relu")(encoder_inputs))
        decoder_inputs = keras.Input((patches, projection))
        x = keras.layers.Flatten()(keras.layers.Dense(8, activation="relu")(decoder_inputs))
        decoder = keras.Model(decoder_inputs, keras.layers.Dense(patches * patch_area)(x))
        return MaskedAutoencoder(Patches(), PatchEncoder(), encoder, decoder)

    return dict(
        cls=MaskedAutoencoder,
        make=make,
        compile=lambda: dict(optimizer=keras.optimizers.Adam(1e-3), loss="mse", metrics=["mae"]),
        fit=lambda: dict(x=vectors(), batch_size=16),
        optimizers=(),
    )


def gradient_accumulation(base: type) -> dict[str, Any]:
    """The widely copied gradient-accumulation step: a ``tf.Variable`` counter, ``tf.cond`` around the update."""

    class CustomTrainStep(base):
        def __init__(self, n_gradients, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.n_gradients = tf.constant(n_gradients, dtype=tf.int32)
            self.n_acum_step = tf.Variable(0, dtype=tf.int32, trainable=False)
            self.gradient_accumulation = [
                tf.Variable(tf.zeros_like(v, dtype=tf.float32), trainable=False) for v in self.trainable_variables
            ]

        def train_step(self, data):
            self.n_acum_step.assign_add(1)
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compiled_loss(y, y_pred, regularization_losses=self.losses)
            gradients = tape.gradient(loss, self.trainable_variables)
            for i in range(len(self.gradient_accumulation)):
                self.gradient_accumulation[i].assign_add(gradients[i])
            tf.cond(tf.equal(self.n_acum_step, self.n_gradients), self.apply_accu_gradients, lambda: None)
            self.compiled_metrics.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

        def apply_accu_gradients(self):
            self.optimizer.apply_gradients(zip(self.gradient_accumulation, self.trainable_variables))
            self.n_acum_step.assign(0)
            for i in range(len(self.gradient_accumulation)):
                self.gradient_accumulation[i].assign(tf.zeros_like(self.trainable_variables[i], dtype=tf.float32))

    def make():
        inputs = keras.Input((FEATURES,))
        outputs = keras.layers.Dense(CLASSES)(keras.layers.Dense(16, activation="relu")(inputs))
        return CustomTrainStep(n_gradients=2, inputs=inputs, outputs=outputs)

    return dict(
        cls=CustomTrainStep,
        make=make,
        compile=lambda: dict(
            optimizer=keras.optimizers.Adam(1e-2),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        ),
        fit=lambda: dict(x=vectors(), y=labels(), batch_size=16),
        optimizers=(),
    )


def masked_lm(base: type) -> dict[str, Any]:
    """keras.io "End-to-end Masked Language Modeling with BERT": module-level loss and tracker, ``reduction=None``."""
    vocabulary, length = 12, 4
    if custom_fit.KERAS_2:
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=keras.losses.Reduction.NONE)
    else:
        loss_fn = keras.losses.SparseCategoricalCrossentropy(reduction=None)
    loss_tracker = keras.metrics.Mean(name="loss")

    class MaskedLanguageModel(base):
        def train_step(self, inputs):
            if len(inputs) == 3:
                features, labels, sample_weight = inputs
            else:
                features, labels = inputs
                sample_weight = None
            with tf.GradientTape() as tape:
                predictions = self(features, training=True)
                loss = loss_fn(labels, predictions, sample_weight=sample_weight)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply_gradients(zip(gradients, trainable_vars))
            loss_tracker.update_state(loss, sample_weight=sample_weight)
            return {"loss": loss_tracker.result()}

        @property
        def metrics(self):
            return [loss_tracker]

    def make():
        inputs = keras.Input((length,), dtype="int32")
        x = keras.layers.Embedding(vocabulary, 8)(inputs)
        x = keras.layers.Dense(8, activation="relu")(x)
        return MaskedLanguageModel(inputs, keras.layers.Dense(vocabulary, activation="softmax")(x))

    def data():
        rng = np.random.default_rng(2)
        tokens = rng.integers(1, vocabulary, size=(64, length)).astype("int32")
        mask = rng.uniform(size=(64, length)) < 0.3
        return dict(x=np.where(mask, 0, tokens), y=tokens, sample_weight=mask.astype("float32"), batch_size=16)

    return dict(
        cls=MaskedLanguageModel,
        make=make,
        compile=lambda: dict(optimizer=keras.optimizers.Adam(1e-3)),
        fit=data,
        optimizers=(),
    )


# --------------------------------------------------------------------------
# The manual workaround under a strategy (the reference for tests/strategy_cases.py)
# --------------------------------------------------------------------------


def first_batch(fit_arguments: dict[str, Any]) -> Any:
    """The first batch ``fit`` would see, as arrays (``x`` only unless ``y`` is given)."""
    x = fit_arguments["x"]
    if isinstance(x, tf.data.Dataset):
        return next(iter(x))
    size = fit_arguments["batch_size"]
    return x[:size] if fit_arguments.get("y") is None else (x[:size], fit_arguments["y"][:size])


def _build_optimizers(model: Any, updates: dict[str, list[str]]) -> None:
    """``model.<optimizer>.build(variables of model.<sub-models>)`` for each attribute optimizer."""
    for optimizer, parts in updates.items():
        getattr(model, optimizer).build([v for part in parts for v in getattr(model, part).trainable_variables])


def _gan_prebuild(model: Any, fit_arguments: dict[str, Any]) -> None:
    _build_optimizers(model, {"d_optimizer": ["discriminator"], "g_optimizer": ["generator"]})
    model.built = True


def _cyclegan_prebuild(model: Any, fit_arguments: dict[str, Any]) -> None:
    parts = {"gen_G_optimizer": ["gen_G"], "gen_F_optimizer": ["gen_F"]}
    _build_optimizers(model, {**parts, "disc_X_optimizer": ["disc_X"], "disc_Y_optimizer": ["disc_Y"]})


def _vae_prebuild(model: Any, fit_arguments: dict[str, Any]) -> None:
    model.sampling.build([(None, LATENT), (None, LATENT)])  # not a call: that would draw noise
    model.optimizer.build(model.trainable_variables)
    model.built = True


def _compiled_optimizer_prebuild(model: Any, fit_arguments: dict[str, Any]) -> None:
    model.optimizer.build(model.trainable_variables)
    model.built = True


def _compiled_metrics_prebuild(model: Any, fit_arguments: dict[str, Any]) -> None:
    x, y = first_batch(fit_arguments)
    if isinstance(x, tuple):  # the self-trainer's (clean, noisy) views
        x, y = x
    model.compiled_metrics.update_state(y, model.student(x))  # builds the compiled metrics
    model.reset_metrics()
    _compiled_optimizer_prebuild(model, fit_arguments)


def _simclr_prebuild(model: Any, fit_arguments: dict[str, Any]) -> None:
    images, _ = first_batch(fit_arguments)
    features = model.encoder(images)
    model.projection_head(features)
    model.linear_probe(features)
    _build_optimizers(
        model, {"contrastive_optimizer": ["encoder", "projection_head"], "probe_optimizer": ["linear_probe"]}
    )
    model.built = True


def _masked_autoencoder_prebuild(model: Any, fit_arguments: dict[str, Any]) -> None:
    model.patch_encoder(model.patch_layer(first_batch(fit_arguments)))
    patches = tf.zeros((1, 2, 2))
    model.compiled_loss(patches, patches)  # builds the compiled loss and metrics
    model.compiled_metrics.update_state(patches, patches)
    model.reset_metrics()
    model.optimizer.build(model.trainable_variables)
    model.built = True


#: What a user writes to train a pattern under a strategy without custom_fit: build the
#: optimizers on the variables they update and the sub-models by a call, mark the model built.
PREBUILD: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "dcgan": _gan_prebuild,
    "dcgan_conv": _gan_prebuild,
    "guide_gan_keras2": _gan_prebuild,
    "conditional": _gan_prebuild,
    "wgan_gp": _gan_prebuild,
    "cyclegan": _cyclegan_prebuild,
    "vae": _vae_prebuild,
    "distiller": _compiled_metrics_prebuild,
    "self_trainer": _compiled_metrics_prebuild,
    "simsiam": _compiled_optimizer_prebuild,
    "barlow_twins": _compiled_optimizer_prebuild,
    "simclr": _simclr_prebuild,
    "masked_autoencoder": _masked_autoencoder_prebuild,
}


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A pattern made for one base class: how to build, compile and fit it."""

    name: str
    cls: Any  # the pattern's model class (Any: a class made per base class)
    make: Callable[[], Any]
    compile: Callable[[], dict[str, Any]]
    fit: Callable[[], dict[str, Any]]
    optimizers: tuple[str, ...]
    custom_objects: dict[str, Any] = dataclasses.field(default_factory=dict)

    def build(self, seed: int) -> Any:
        """A new model from ``seed``, compiled."""
        keras.utils.set_random_seed(seed)
        model = self.make()
        model.compile(**self.compile())
        return model

    def optimizer_objects(self, model: Any) -> list[Any]:
        """Every optimizer the pattern trains with (attributes, or the compiled one)."""
        return [getattr(model, name) for name in self.optimizers] or [model.optimizer]


PATTERNS = {
    factory.__name__: factory
    for factory in (dcgan, wgan_gp, conditional, cyclegan, vae, distiller, simsiam, barlow_twins, simclr, sam, trainer)
}


#: Patterns that only the strategy cases run (``tests/strategy_cases.py``); with ``PATTERNS``, ``ALL_PATTERNS``.
MORE_PATTERNS = {
    factory.__name__: factory
    for factory in (
        guide_keras3,
        guide_keras2,
        guide_gan_keras2,
        dcgan_conv,
        self_trainer,
        masked_autoencoder,
        gradient_accumulation,
        masked_lm,
    )
}
ALL_PATTERNS = {**PATTERNS, **MORE_PATTERNS}


def pattern(name: str, base: type) -> Pattern:
    return Pattern(name=name, **ALL_PATTERNS[name](base))
