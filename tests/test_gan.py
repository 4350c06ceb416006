"""custom_fit.GAN on scikit-learn's digits: DCGAN, hinge, WGAN-GP, conditional; steps, logging, saving."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import custom_fit
from benchmarks.baselines import keras_io_gan
from custom_fit import _compat, keras
from custom_fit.gan_samples import GenerateSamples, image_grid
from tests import parity

LATENT = 16


def digits(n=256):
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images[:n] / 8.0 - 1.0).astype("float32")[..., None]  # [-1, 1], 8x8x1
    return images, data.target[:n].astype("int32")


def dcgan_parts(conditional=False):
    noise = keras.Input((LATENT,))
    inputs = [noise]
    h = noise
    if conditional:
        label = keras.Input((), dtype="int32")
        inputs.append(label)
        h = keras.layers.Concatenate()([noise, keras.layers.Embedding(10, 8)(label)])
    h = keras.layers.Dense(4 * 4 * 16, activation="relu")(h)
    h = keras.layers.Reshape((4, 4, 16))(h)
    h = keras.layers.Conv2DTranspose(16, 3, strides=2, padding="same", activation="relu")(h)
    images = keras.layers.Conv2D(1, 3, padding="same", activation="tanh")(h)
    generator = keras.Model(inputs if conditional else noise, images, name="generator")

    image = keras.Input((8, 8, 1))
    d_inputs = [image]
    h = keras.layers.Conv2D(16, 3, strides=2, padding="same")(image)
    h = keras.layers.LeakyReLU(0.2)(h)
    h = keras.layers.Flatten()(h)
    if conditional:
        d_label = keras.Input((), dtype="int32")
        d_inputs.append(d_label)
        h = keras.layers.Concatenate()([h, keras.layers.Embedding(10, 8)(d_label)])
    logit = keras.layers.Dense(1)(h)
    discriminator = keras.Model(d_inputs if conditional else image, logit, name="discriminator")
    return generator, discriminator


def make_gan(loss="bce", seed=3, conditional=False, **kwargs):
    keras.utils.set_random_seed(seed)
    generator, discriminator = dcgan_parts(conditional)
    return custom_fit.GAN(
        generator, discriminator, LATENT, loss=loss, seed=seed, num_classes=10 if conditional else None, **kwargs
    )


@pytest.mark.parametrize("loss", ["bce", "hinge", "wgan-gp"])
def test_gan_trains_two_epochs_with_both_optimizers(loss, tmp_path):
    x, _ = digits()
    gan = make_gan(loss)
    gan.compile()
    sampler = GenerateSamples(n=16)
    history = gan.fit(x, batch_size=32, epochs=2, verbose=0, callbacks=[sampler]).history
    expected = {"d_loss", "g_loss"} | ({"gradient_penalty"} if loss == "wgan-gp" else set())
    assert set(history) == expected
    assert all(np.isfinite(v).all() for v in history.values())
    steps = 2 * 8
    critic = 5 if loss == "wgan-gp" else 1
    assert int(gan.optimizer["generator"].iterations) == steps
    assert int(gan.optimizer["discriminator"].iterations) == critic * steps
    assert int(gan.optimizer.iterations) == steps
    assert len(sampler.samples) == 2 and sampler.samples[-1].shape == (16, 8, 8, 1)
    if loss == "wgan-gp":
        assert history["gradient_penalty"][-1] > 0


@pytest.mark.slow
def test_each_sub_step_changes_only_its_sub_model():
    x, _ = digits(32)
    gan = make_gan("wgan-gp")
    gan.compile()
    gan.fit(x, batch_size=32, epochs=1, verbose=0)  # builds both optimizers
    real = tf.constant(x)
    for step, changed, unchanged in (
        (gan.train_discriminator, gan.discriminator, gan.generator),
        (lambda r: gan.train_generator(32), gan.generator, gan.discriminator),
    ):
        before_changed = [np.array(w) for w in changed.get_weights()]
        before_unchanged = [np.array(w) for w in unchanged.get_weights()]
        step(real)
        assert parity.max_delta(before_changed, changed.get_weights()) > 0
        assert parity.max_delta(before_unchanged, unchanged.get_weights()) == 0.0


def test_gradient_penalty_is_second_order():
    """The critic's update differentiates through the penalty's own gradient (nested tapes)."""
    x, _ = digits(16)
    gan = make_gan("wgan-gp")
    real = tf.constant(x)
    fake = gan.generator(gan.sample_noise(16))
    with tf.GradientTape() as tape:
        penalty = gan.gradient_penalty(real, fake, None)
    grads = tape.gradient(penalty, gan.discriminator.trainable_weights)
    assert all(g is not None for g in grads[:-1]), "penalty must depend on the critic's weights"
    assert float(penalty) > 0


def test_conditional_gan_generates_requested_classes():
    x, y = digits()
    gan = make_gan("bce", conditional=True)
    gan.compile()
    history = gan.fit(x, y, batch_size=32, epochs=1, verbose=0).history
    assert np.isfinite(history["d_loss"]).all()
    assert gan.generate(10, labels=list(range(10))).shape == (10, 8, 8, 1)
    with pytest.raises(
        ValueError, match=r"expected batches of \(samples, labels\), received samples only. Fix: fit\(x, labels\)"
    ):
        gan.fit(x, epochs=1, verbose=0)


def test_steps_per_execution_logs_the_same_epoch_means():
    x, _ = digits(200)  # 7 batches of 32 (last one partial)
    histories = []
    for spe in (1, 4):
        gan = make_gan("bce")
        gan.compile(steps_per_execution=spe)
        histories.append(gan.fit(x, batch_size=32, epochs=2, verbose=0, validation_data=(x[:64],)).history)
    delta = parity.max_delta(histories[0], histories[1])
    parity.record("GAN: steps_per_execution=4 vs 1 (epoch means)", history=delta)
    assert delta == 0.0
    assert sorted(histories[0]) == ["d_loss", "g_loss", "val_d_loss", "val_g_loss"]


def test_logged_values_are_batch_weighted_epoch_means_reset_each_epoch():
    """The epoch value is the sample-weighted mean of the batch values, not the last batch."""

    class Fixed(custom_fit.CustomModel):
        logged_values = ("first", "size")

        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = custom_fit.batch_mean(tf.square(self(x) - y))
            self.minimize(loss, tape, self.trainable_weights)
            self.log_values(x, first=tf.reduce_mean(x[:, 0]), size=tf.cast(tf.shape(x)[0], "float32"))
            return self.get_metrics_result()

        def test_step(self, data):
            x, _ = data
            self.log_values(x, first=tf.reduce_mean(x[:, 0]), size=tf.cast(tf.shape(x)[0], "float32"))
            return self.get_metrics_result()

    x = np.arange(10, dtype="float32").reshape(10, 1)
    model = Fixed()
    model.compile(optimizer="sgd")
    history = model.fit(x, x, batch_size=4, epochs=2, shuffle=False, verbose=0).history
    assert history["first"] == [pytest.approx(4.5), pytest.approx(4.5)]  # mean of 0..9, batches 4+4+2
    assert history["size"] == [pytest.approx((16 + 16 + 4) / 10)] * 2
    assert "loss" not in history
    assert model.evaluate(x, x, batch_size=4, verbose=0, return_dict=True)["first"] == pytest.approx(4.5)


def test_callbacks_monitor_reported_values(tmp_path):
    x, _ = digits(128)
    gan = make_gan("bce")
    gan.compile()
    callbacks = [
        keras.callbacks.EarlyStopping(monitor="g_loss", patience=5),  # mode inferred: lower is better
        keras.callbacks.ModelCheckpoint(
            str(tmp_path / "best.weights.h5"),
            monitor="val_d_loss",
            mode="min",
            save_best_only=True,
            save_weights_only=True,
        ),
        keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        keras.callbacks.TensorBoard(str(tmp_path / "tb")),
    ]
    callbacks.append(keras.callbacks.ReduceLROnPlateau(monitor="d_loss", factor=0.5, patience=0, min_delta=10.0))
    gan.fit(x, batch_size=32, epochs=2, verbose=0, validation_data=(x[:64],), callbacks=callbacks)
    header = (tmp_path / "log.csv").read_text().splitlines()[0].split(",")
    assert {"d_loss", "g_loss", "val_d_loss", "val_g_loss"} <= set(header)
    assert (tmp_path / "best.weights.h5").exists()
    assert list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    # ReduceLROnPlateau reduced every member once (Keras 2 too): epoch 1 sets the
    # reference, epoch 2 does not improve on it by min_delta=10.
    assert float(np.array(gan.optimizer["generator"].learning_rate)) == pytest.approx(2e-4 * 0.5)
    assert float(np.array(gan.optimizer["discriminator"].learning_rate)) == pytest.approx(2e-4 * 0.5)


def test_compile_rejects_what_a_gan_cannot_use():
    gan = make_gan("hinge")
    with pytest.raises(
        ValueError, match=r"received \['loss', 'metrics'\], which a GAN does not use.*loss='hinge'.*Fix"
    ):
        gan.compile(loss="mse", metrics=["mae"])
    with pytest.raises(ValueError, match=r"received \['loss'\]"):
        gan.compile(None, "mse")
    for optimizer in ("adam", {"generator": "adam"}, {"generator": "adam", "discriminator": "adam", "critic": "sgd"}):
        with pytest.raises(ValueError, match=r"a GAN trains two models with two optimizers.*Fix: compile\(optimizer="):
            gan.compile(optimizer=optimizer)
    gan.compile(optimizer=None)  # no optimizer: evaluation and sampling only, as for any CustomModel
    assert gan.optimizer is None


def fit_gan(gan, x, epochs, **kwargs):
    return gan.fit(x, batch_size=32, epochs=epochs, shuffle=False, verbose=0, **kwargs).history


def uninterrupted_gan(loss, x, epochs=4):
    """The reference a resumed run must equal: the same GAN trained without a break."""
    gan = make_gan(loss)
    gan.compile()
    fit_gan(gan, x, epochs)
    return gan


@pytest.mark.slow
def test_save_and_load_restore_every_optimizer(tmp_path):
    x, _ = digits(128)
    reference = uninterrupted_gan("wgan-gp", x)

    gan = make_gan("wgan-gp")
    gan.compile()
    fit_gan(gan, x, 2)
    gan.save(tmp_path / "gan.keras")
    loaded = keras.models.load_model(tmp_path / "gan.keras")
    assert type(loaded) is custom_fit.GAN and isinstance(loaded.optimizer, custom_fit.NamedOptimizers)
    for name in ("generator", "discriminator"):
        assert int(loaded.optimizer[name].iterations) == int(gan.optimizer[name].iterations) > 0
        assert (
            parity.max_delta(
                [v.numpy() for v in gan.optimizer[name].variables],
                [v.numpy() for v in loaded.optimizer[name].variables],
            )
            == 0.0
        )
    history = fit_gan(loaded, x, 4, initial_epoch=2)
    delta = parity.max_delta(reference.get_weights(), loaded.get_weights())
    parity.record("GAN wgan-gp: save/load .keras, resume", weights=delta)
    assert delta == 0.0 and len(history["d_loss"]) == 2


def test_backup_and_restore_resumes_multi_optimizer_run_exactly(tmp_path):
    x, _ = digits(128)
    reference = uninterrupted_gan("bce", x)

    gan = make_gan("bce")
    gan.compile()
    with pytest.raises(RuntimeError, match="simulated"):
        fit_gan(gan, x, 4, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path)), parity.StopAt(2)])
    resumed = make_gan("bce", seed=3)
    resumed.compile()
    keras.utils.set_random_seed(99)  # whatever the process state, the backup decides
    fit_gan(resumed, x, 4, callbacks=[keras.callbacks.BackupAndRestore(str(tmp_path))])
    delta = parity.max_delta(reference.get_weights(), resumed.get_weights())
    parity.record("GAN bce: BackupAndRestore after interruption", weights=delta)
    assert delta == 0.0
    assert int(resumed.optimizer["generator"].iterations) == int(reference.optimizer["generator"].iterations)


def test_weights_and_checkpoint_round_trip_all_optimizer_slots(tmp_path):
    x, _ = digits(64)
    gan = make_gan("bce")
    gan.compile()
    fit_gan(gan, x, 1)
    gan.save_weights(tmp_path / "gan.weights.h5")
    other = make_gan("bce", seed=11)
    other.compile()
    other.optimizer.build(other.trainable_variables)
    other.load_weights(tmp_path / "gan.weights.h5")
    checkpoint_path = tf.train.Checkpoint(model=gan).save(str(tmp_path / "ckpt"))
    third = make_gan("bce", seed=12)
    third.compile()
    third.optimizer.build(third.trainable_variables)
    tf.train.Checkpoint(model=third).restore(checkpoint_path).assert_existing_objects_matched()
    for restored in (other, third):
        assert parity.max_delta(gan.get_weights(), restored.get_weights()) == 0.0
        for name in ("generator", "discriminator"):
            assert (
                parity.max_delta(
                    [v.numpy() for v in gan.optimizer[name].variables],
                    [v.numpy() for v in restored.optimizer[name].variables],
                )
                == 0.0
            )


def conditional_mlp_parts() -> tuple[keras.Model, keras.Model]:
    """An MLP generator and discriminator conditioned on the digit class."""
    noise, label = keras.Input((LATENT,)), keras.Input((), dtype="int32")
    h = keras.layers.Concatenate()([noise, keras.layers.Embedding(10, 16)(label)])
    for _ in range(2):
        h = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(128)(h))
    images = keras.layers.Reshape((8, 8, 1))(keras.layers.Dense(64, activation="tanh")(h))
    image, d_label = keras.Input((8, 8, 1)), keras.Input((), dtype="int32")
    h = keras.layers.Concatenate()([keras.layers.Flatten()(image), keras.layers.Embedding(10, 16)(d_label)])
    for _ in range(2):
        h = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(128)(h))
    return (
        keras.Model([noise, label], images, name="generator"),
        keras.Model([image, d_label], keras.layers.Dense(1)(h), name="discriminator"),
    )


@pytest.mark.slow
def test_digits_gan_image_grid(tmp_path):
    """Saves the grid the closing note describes: 4 samples per digit after 100 epochs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x, y = digits(1797)
    keras.utils.set_random_seed(3)
    gan = custom_fit.GAN(*conditional_mlp_parts(), LATENT, num_classes=10, seed=3)
    gan.compile(optimizer={k: keras.optimizers.Adam(1e-3, beta_1=0.5) for k in ("generator", "discriminator")})
    gan.fit(x, y, batch_size=64, epochs=100, verbose=0)
    samples = gan.generate(40, labels=[d for d in range(10) for _ in range(4)])
    grid = image_grid(samples.reshape(4 * 10, 8, 8)[np.argsort(np.tile(np.arange(4), 10), kind="stable")], columns=10)
    assert grid.shape == (32, 80)
    plt.imsave(tmp_path / "digits_gan.png", np.kron(grid, np.ones((8, 8))), cmap="gray_r")
    assert (tmp_path / "digits_gan.png").stat().st_size > 0
    # Generated images should look like their class more than like other classes:
    # compare each sample with the class means of the real digits.
    means = np.stack([x[y == d].mean(axis=0) for d in range(10)])
    distances = ((samples[:, None] - means[None]) ** 2).sum(axis=(2, 3, 4))
    correct = float(np.mean(distances.argmin(axis=1) == np.repeat(np.arange(10), 4)))
    print(f"generated digits nearest their own class mean: {correct:.0%}")
    assert correct >= 0.5, f"only {correct:.0%} of generated digits are nearest their own class mean"


# The keras.io GAN (optimizers as attributes, its own compile() signature), unchanged
# but for its base class; benchmarks/baselines.py holds the code for both uses.
KerasIoGAN = keras_io_gan(custom_fit.CustomModel)


@pytest.mark.keras3  # the keras.io GAN is Keras 3 code (keras.random, keras.ops)
def test_keras_io_style_gan_trains_unchanged():
    x, _ = digits(128)
    keras.utils.set_random_seed(1)
    generator, discriminator = dcgan_parts()
    gan = KerasIoGAN(discriminator=discriminator, generator=generator, latent_dim=LATENT)
    gan.compile(
        d_optimizer=keras.optimizers.Adam(3e-4),
        g_optimizer=keras.optimizers.Adam(3e-4),
        loss_fn=keras.losses.BinaryCrossentropy(from_logits=True),
    )
    # No stray default optimizer: model.optimizer groups the two attributes, by name.
    assert isinstance(gan.optimizer, custom_fit.NamedOptimizers) and gan.optimizer.from_attributes
    assert gan.optimizer.optimizers == [gan.d_optimizer, gan.g_optimizer]
    history = gan.fit(x, batch_size=32, epochs=2, verbose=0).history
    assert sorted(history) == ["d_loss", "g_loss"] and np.isfinite(history["d_loss"]).all()
    assert int(gan.d_optimizer.iterations) == int(gan.g_optimizer.iterations) == 8


class VAE(custom_fit.CustomModel):
    """One optimizer, three reported losses (the multi-loss case without a GAN)."""

    logged_values = ("loss", "reconstruction_loss", "kl_loss")

    def __init__(self, latent=2, **kwargs):
        super().__init__(**kwargs)
        self.encoder = keras.Sequential(
            [keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(2 * latent)],
            name="encoder",
        )
        self.decoder = keras.Sequential(
            [keras.Input((latent,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(64)], name="decoder"
        )
        self.noise = _compat.version.SeedGenerator(0)  # keras.random.SeedGenerator on Keras 3
        self.built = True

    def call(self, x, training=False):
        mean, log_var = tf.split(self.encoder(x), 2, axis=-1)
        z = (
            mean + tf.exp(0.5 * log_var) * _compat.version.random_normal(tf.shape(mean), self.noise)
            if training
            else mean
        )
        return self.decoder(z), mean, log_var

    def compute_vae_losses(self, x, training):
        reconstruction, mean, log_var = self(x, training=training)
        reconstruction_loss = custom_fit.batch_mean(tf.reduce_sum(tf.square(x - reconstruction), axis=-1))
        kl_loss = custom_fit.batch_mean(-0.5 * tf.reduce_sum(1 + log_var - tf.square(mean) - tf.exp(log_var), axis=-1))
        return reconstruction_loss + kl_loss, reconstruction_loss, kl_loss

    def train_step(self, data):
        with tf.GradientTape() as tape:
            loss, reconstruction_loss, kl_loss = self.compute_vae_losses(data, training=True)
        self.minimize(loss, tape, self.trainable_weights)
        self.log_values(data, loss=loss, reconstruction_loss=reconstruction_loss, kl_loss=kl_loss)
        return self.get_metrics_result()

    def test_step(self, data):
        loss, reconstruction_loss, kl_loss = self.compute_vae_losses(data, training=False)
        self.log_values(data, loss=loss, reconstruction_loss=reconstruction_loss, kl_loss=kl_loss)
        return self.get_metrics_result()


def test_vae_reports_three_losses_with_one_optimizer():
    x, _ = digits(512)
    x = x.reshape(-1, 64)
    keras.utils.set_random_seed(0)
    vae = VAE()
    vae.compile(optimizer=keras.optimizers.Adam(1e-3))
    history = vae.fit(x, batch_size=64, epochs=5, verbose=0, validation_data=(x[:128],)).history
    assert sorted(history) == [
        "kl_loss",
        "loss",
        "reconstruction_loss",
        "val_kl_loss",
        "val_loss",
        "val_reconstruction_loss",
    ]
    assert history["loss"][-1] < history["loss"][0]
    for epoch in range(5):  # the parts add up, as epoch means
        assert history["loss"][epoch] == pytest.approx(
            history["reconstruction_loss"][epoch] + history["kl_loss"][epoch], rel=1e-5
        )
    with pytest.raises(
        ValueError,
        match=(
            r"log_values\(\) received 'elbo', which is not in VAE.logged_values = \('loss', "
            r"'reconstruction_loss', 'kl_loss'\).*Fix: add 'elbo'"
        ),
    ):
        vae.log_values(x, elbo=1.0)


def test_gan_argument_errors_say_how_to_fix():
    generator, discriminator = dcgan_parts()
    with pytest.raises(
        ValueError, match=r"GAN loss must be one of \('bce', 'hinge', 'wgan-gp'\), received loss='wgan'. Fix"
    ):
        custom_fit.GAN(generator, discriminator, LATENT, loss="wgan")
    unbuilt = keras.Sequential([keras.layers.Dense(1)])
    with pytest.raises(
        ValueError,
        match=(
            r"GAN expected a built keras.Model as discriminator, received Sequential \(not built\)\. "
            r"Fix: build it with an Input"
        ),
    ):
        custom_fit.GAN(generator, unbuilt, LATENT)


@pytest.mark.slow
def test_validation_does_not_change_training():
    """Evaluation draws its own noise: fit with and without validation_data trains identically."""
    x, _ = digits(128)
    weights = []
    for validation in (None, (x[:64],)):
        gan = make_gan("wgan-gp")
        gan.compile()
        gan.fit(x, batch_size=32, epochs=2, shuffle=False, verbose=0, validation_data=validation)
        weights.append(gan.generator.get_weights() + gan.discriminator.get_weights())
    assert parity.max_delta(weights[0], weights[1]) == 0.0


def test_generator_ema_ends_on_the_generator_moving_averages():
    """``use_ema=True`` on the generator's optimizer: fit leaves the generator on its averages, as Keras would."""
    x, _ = digits(64)
    gans = {}
    for ema in (False, True):
        gan = make_gan("bce")
        gan.compile(
            optimizer={
                "generator": keras.optimizers.Adam(2e-3, beta_1=0.5, use_ema=ema),
                "discriminator": keras.optimizers.Adam(2e-3, beta_1=0.5),
            }
        )
        gan.fit(x, batch_size=16, epochs=1, verbose=0)
        gans[ema] = gan
    ema_gan, plain = gans[True], gans[False]
    averages = [np.array(v) for v in ema_gan.optimizer["generator"]._model_variables_moving_average]
    assert parity.max_delta(ema_gan.generator.trainable_weights, averages) == 0.0
    assert parity.max_delta(ema_gan.generator.get_weights(), plain.generator.get_weights()) > 0
    # EMA does not change the training itself: the discriminator ends where it ends without it.
    assert parity.max_delta(ema_gan.discriminator.get_weights(), plain.discriminator.get_weights()) == 0.0
