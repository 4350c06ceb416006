"""Train a CustomModel with MultiWorkerMirroredStrategy: one process per worker.

Each worker reads ``TF_CONFIG`` (the cluster and its own index), builds the
model under the strategy and trains on its shard of the data; gradients are
summed across workers every step, so all workers end with the same weights.

Two workers on this machine, started by hand (two terminals, or ``&``)::

    CLUSTER='"cluster": {"worker": ["127.0.0.1:12345", "127.0.0.1:12346"]}'
    TF_CONFIG="{$CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 0}}" python examples/multi_worker.py &
    TF_CONFIG="{$CLUSTER, \"task\": {\"type\": \"worker\", \"index\": 1}}" python examples/multi_worker.py
    wait

or let this script start them: ``python examples/multi_worker.py --launch 2``.
On several machines, list every machine's ``host:port`` under ``"worker"`` and
start the script on each with its own ``"index"``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

GLOBAL_BATCH = 64


def launch(n_workers: int, epochs: int) -> int:
    """Starts ``n_workers`` copies of this script on 127.0.0.1 with matching TF_CONFIGs."""
    sockets = [socket.socket() for _ in range(n_workers)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    cluster = {"worker": [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]}
    for s in sockets:
        s.close()
    workers = []
    for index in range(n_workers):
        env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        workers.append(subprocess.Popen([sys.executable, __file__, "--epochs", str(epochs)], env=env))
    return max(worker.wait() for worker in workers)


def train(epochs: int) -> None:
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()  # reads TF_CONFIG

    from demo import build_cnn, load_digits_split  # examples/demo.py, beside this script

    from custom_fit import keras  # Keras 3, or tf_keras under TF_USE_LEGACY_KERAS=1
    from custom_fit._model import CustomModel

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    x_train, y_train, x_test, y_test = load_digits_split(seed=0)

    def shard(context: tf.distribute.InputContext) -> tf.data.Dataset:
        """This worker's part of every global batch."""
        batch = context.get_per_replica_batch_size(GLOBAL_BATCH)
        data = tf.data.Dataset.from_tensor_slices((x_train, y_train))
        data = data.shard(context.num_input_pipelines, context.input_pipeline_id).batch(batch, drop_remainder=True)
        return data.repeat()  # steps_per_epoch reads one pass per epoch (tf_keras keeps one iterator)

    keras.utils.set_random_seed(0)  # every worker starts from the same weights
    with strategy.scope():
        model = build_cnn(CustomModel)
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(
        strategy.distribute_datasets_from_function(shard),
        epochs=epochs,
        steps_per_epoch=len(x_train) // GLOBAL_BATCH,
        shuffle=False,  # each worker's shard is fixed by shard()
        verbose=2 if task["index"] == 0 else 0,
    )
    _, accuracy = model.evaluate(x_test, y_test, verbose=0)
    # One write per line: both workers share the launcher's stdout, and a single
    # short write() to a pipe is not interleaved with the other worker's.
    sys.stdout.write(
        f"worker {task['index']}: {strategy.num_replicas_in_sync} replicas, "
        f"final loss {history.history['loss'][-1]:.4f}, test accuracy {accuracy:.4f}, "
        f"weight checksum {sum(float(w.sum()) for w in model.get_weights()):.6f}\n"
    )
    sys.stdout.flush()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch", type=int, metavar="N", help="start N local workers instead of being one")
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if args.launch:
        return launch(args.launch, args.epochs)
    if "TF_CONFIG" not in os.environ:
        parser.error(
            "TF_CONFIG is not set: expected the cluster and this worker's index "
            "(see this file's docstring), or use --launch N to start N local workers"
        )
    train(args.epochs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
