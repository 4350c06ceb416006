"""The ways of writing a training step that custom_fit is compared with (Keras 3 code).

* ``tf_function_loop``: a hand-written loop, ``tf.data`` + a ``tf.function`` step.
* ``keras_io_gan``: the keras.io GAN (optimizers as attributes, own ``compile``).
* ``tf_function_gan_loop``: a hand-written two-optimizer GAN loop.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf


def tf_function_loop(model: keras.Model, batch_size: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """``run_epoch(x, y)``: one epoch of a ``tf.function`` step over a ``tf.data`` pipeline."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy()
    optimizer = keras.optimizers.Adam()
    train_loss = keras.metrics.Mean()
    train_accuracy = keras.metrics.SparseCategoricalAccuracy()

    @tf.function(reduce_retracing=True)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            predictions = model(x, training=True)
            loss = loss_fn(y, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        train_loss.update_state(loss)
        train_accuracy.update_state(y, predictions)

    def run_epoch(x, y):
        train_loss.reset_state()
        train_accuracy.reset_state()
        for xb, yb in tf.data.Dataset.from_tensor_slices((x, y)).batch(batch_size):
            train_step(xb, yb)

    return run_epoch


def keras_io_gan(base: type = keras.Model) -> type:
    """The keras.io GAN, on ``base`` (unchanged but for the base class)."""

    class KerasIoGAN(base):
        def __init__(self, discriminator, generator, latent_dim):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.latent_dim = latent_dim
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")
            self.seed_generator = keras.random.SeedGenerator(1337)

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker]

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer = d_optimizer
            self.g_optimizer = g_optimizer
            self.loss_fn = loss_fn

        def train_step(self, real_images):
            if isinstance(real_images, tuple):
                real_images = real_images[0]
            batch_size = tf.shape(real_images)[0]
            random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
            generated_images = self.generator(random_latent_vectors)
            combined_images = tf.concat([generated_images, real_images], axis=0)
            labels = tf.concat([tf.ones((batch_size, 1)), tf.zeros((batch_size, 1))], axis=0)
            labels += 0.05 * keras.random.uniform(tf.shape(labels), seed=self.seed_generator)
            with tf.GradientTape() as tape:
                predictions = self.discriminator(combined_images)
                d_loss = self.loss_fn(labels, predictions)
            grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
            random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
            misleading_labels = tf.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                predictions = self.discriminator(self.generator(random_latent_vectors))
                g_loss = self.loss_fn(misleading_labels, predictions)
            grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    return KerasIoGAN


def tf_function_gan_loop(generator, discriminator, latent_dim: int, batch_size: int) -> Callable[[np.ndarray], None]:
    """``run_epoch(x)``: a hand-written non-saturating GAN loop with two optimizers."""
    d_optimizer, g_optimizer = keras.optimizers.Adam(2e-4, beta_1=0.5), keras.optimizers.Adam(2e-4, beta_1=0.5)
    bce = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def train_step(real):
        n = tf.shape(real)[0]
        fake = generator(tf.random.normal((n, latent_dim)), training=True)
        with tf.GradientTape() as tape:
            real_logits = discriminator(real, training=True)
            fake_logits = discriminator(fake, training=True)
            d_loss = bce(tf.ones_like(real_logits), real_logits) + bce(tf.zeros_like(fake_logits), fake_logits)
        grads = tape.gradient(d_loss, discriminator.trainable_weights)
        d_optimizer.apply_gradients(zip(grads, discriminator.trainable_weights, strict=True))
        with tf.GradientTape() as tape:
            fake_logits = discriminator(generator(tf.random.normal((n, latent_dim)), training=True), training=True)
            g_loss = bce(tf.ones_like(fake_logits), fake_logits)
        grads = tape.gradient(g_loss, generator.trainable_weights)
        g_optimizer.apply_gradients(zip(grads, generator.trainable_weights, strict=True))

    def run_epoch(x):
        for batch in tf.data.Dataset.from_tensor_slices(x).batch(batch_size):
            train_step(batch)

    return run_epoch
