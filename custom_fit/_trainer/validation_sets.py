"""``fit``'s validation data: one set, as Keras takes it, or several named sets.

Keras validates on one set. ``fit(validation_data={"easy": (x, y), "hard":
dataset})`` validates on each named set whenever validation runs (at the
epochs ``validation_freq`` says, or after every N steps with
:class:`~custom_fit.Steps`), one ``evaluate`` per set with ``fit``'s callbacks,
and logs each set's loss and metrics as ``val_<set>_<name>`` (``val_easy_loss``,
``val_hard_accuracy``): ``History``, the progress bar, ``CSVLogger``,
``TensorBoard`` (the validation writer, tagged ``epoch_<set>_<name>``) and the
callbacks that monitor a value (``EarlyStopping(monitor="val_hard_loss")``)
see them as they see ``val_loss``. Lightning does the same with several
validation loaders, each logged under its own name.

What a dict means: a dict whose values are all ``(x, y)`` or ``(x, y,
sample_weight)`` tuples (or lists), ``tf.data.Dataset``\\ s, Keras
``PyDataset``\\ s/``Sequence``\\ s or generators is a dict of named sets; a
dict whose values are arrays or tensors is a dict of the model's inputs, as
in Keras. A set's name is stripped, and every run of characters other than
letters, digits and ``_`` becomes ``_`` (``"hard set"``: ``val_hard_set_loss``).
``validation_steps`` and ``validation_batch_size`` are one number for every
set or a dict by set name (a set left out: Keras' default). Without a dict,
nothing changes: one set, Keras' ``val_`` names.

Example:
    >>> import numpy as np, keras, custom_fit
    >>> model = custom_fit.CustomSequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> x, y = np.ones((8, 2)), np.ones((8, 1))
    >>> history = model.fit(x, y, validation_data={"easy": (x, y), "hard": (x, 2 * y)}, verbose=0)
    >>> sorted(name for name in history.history if name.startswith("val_"))
    ['val_easy_loss', 'val_hard_loss']
"""

from __future__ import annotations

import collections.abc
import dataclasses
import re
from typing import Any

import tensorflow as tf

from custom_fit import _compat
from custom_fit._compat import keras

__all__ = ["ValidationSet", "named_logs", "validation_sets"]

#: The characters a set's name keeps; every run of others becomes ``_`` (names go into log keys
#: that ``ModelCheckpoint`` file paths format, ``{val_hard_loss}``).
_NOT_KEPT = re.compile(r"[^0-9A-Za-z_]+")


@dataclasses.dataclass
class ValidationSet:
    """One set ``fit`` validates on, and how each run reads it.

    Attributes:
        name: The set's name in the logs (``val_<name>_<metric>``); ``None`` for
            ``fit``'s one set as Keras takes it (``val_<metric>``).
        x, y, sample_weight: The set's data, as ``evaluate`` takes it.
        batch_size, steps: ``evaluate``'s ``batch_size`` and ``steps`` for the set.
    """

    name: str | None
    x: Any
    y: Any
    sample_weight: Any
    batch_size: int | None
    steps: int | None

    def logs(self, evaluated: dict[str, Any]) -> dict[str, Any]:
        """``evaluate``'s logs on this set, named as ``fit`` logs them.

        Example:
            >>> ValidationSet("hard", None, None, None, None, None).logs({"loss": 0.5})
            {'val_hard_loss': 0.5}
        """
        return {f"val_{name}": value for name, value in named_logs(self.name, evaluated).items()}


def named_logs(name: str | None, logs: dict[str, Any]) -> dict[str, Any]:
    """``logs`` of the validation set ``name`` with its name: ``{"<name>_<metric>": value}`` (``None``: as they are).

    What ``on_test_end`` gets while ``fit`` validates on a named set, so that a
    tool logging there (MLflow's callback: ``validation_<name>_loss``) keeps
    the sets apart.

    Example:
        >>> named_logs("hard", {"loss": 0.5}), named_logs(None, {"loss": 0.5})
        ({'hard_loss': 0.5}, {'loss': 0.5})
    """
    return logs if name is None else {f"{name}_{metric}": value for metric, value in logs.items()}


def validation_sets(
    data: Any,
    *,
    batch_size: int | dict[str, int] | None,
    steps: int | dict[str, int] | None,
    fit_batch_size: int | None,
    validation_split: float,
    output_names: list[str] | None,
) -> list[ValidationSet]:
    """The sets ``fit(validation_data=data)`` validates on: none, Keras' one, or each named set of a dict.

    Args:
        data: ``fit``'s ``validation_data`` (after ``validation_split`` made it, if it did).
        batch_size: ``validation_batch_size``: one for every set, or a dict by set name.
        steps: ``validation_steps``: one for every set, or a dict by set name.
        fit_batch_size: ``fit``'s ``batch_size`` (a set's default, as in Keras).
        validation_split: ``fit``'s (refused together with named sets).
        output_names: The model's output names, if it has several (their
            metrics are named after them: a set name must not make two sets' log
            names the same).

    Raises:
        ValueError: An empty dict, a name that is not a string or is empty or
            used twice once normalised, a dict mixing sets and arrays,
            ``validation_split`` with named sets, a set of ``validation_steps``
            or ``validation_batch_size`` that is not a set's, or two sets whose
            log names would be the same.
    """
    if not _is_named_sets(data):
        if isinstance(steps, dict) or isinstance(batch_size, dict):
            option, value = (
                ("validation_steps", steps) if isinstance(steps, dict) else ("validation_batch_size", batch_size)
            )
            raise ValueError(
                f"fit({option}=dict) gives a value per named validation set; received {value!r} with "
                f"validation_data of type {type(data).__name__}, not a dict of named sets. Fix: pass one "
                f'number as {option}, or name the sets: validation_data={{"easy": (x, y), ...}}.'
            )
        if not _compat.loop.has_validation_data(data):
            return []
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        return [ValidationSet(None, x, y, sample_weight, batch_size or fit_batch_size, steps)]
    if validation_split:
        raise ValueError(
            f"fit() received validation_split={validation_split!r} and named validation sets "
            f"({', '.join(map(repr, data))}). Expected one of them: the split's arrays would be a set without a "
            'name. Fix: split the arrays yourself and add them as a set, e.g. validation_data={"split": '
            "(x_val, y_val), ...}, or drop validation_split."
        )
    names = _names(data)
    _check_log_names(list(names.values()), output_names or [])
    sets = []
    for key, name in names.items():
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data[key])
        size = _for_set(batch_size, name, names, "validation_batch_size")
        sets.append(
            ValidationSet(
                name, x, y, sample_weight, size or fit_batch_size, _for_set(steps, name, names, "validation_steps")
            )
        )
    return sets


def _is_named_sets(data: Any) -> bool:
    """Whether ``data`` is a dict of named sets (not Keras' dict of the model's inputs)."""
    if not isinstance(data, dict):
        return False
    if not data:
        raise ValueError(
            "fit(validation_data={}) received an empty dict. Expected named validation sets, e.g. "
            'validation_data={"easy": (x, y), "hard": dataset}, or the model\'s inputs by name. Fix: add a set, '
            "or pass validation_data=None to train without validation."
        )
    kinds = {key: _is_a_set(value) for key, value in data.items()}
    if all(kinds.values()):
        return True
    if any(kinds.values()):
        sets = [key for key, is_set in kinds.items() if is_set]
        others = [key for key, is_set in kinds.items() if not is_set]
        raise ValueError(
            f"fit(validation_data=dict) mixes named sets ({', '.join(map(repr, sets))}: tuples or datasets) with "
            f"other values ({', '.join(f'{key!r}: {type(data[key]).__name__}' for key in others)}). Expected "
            "either every value a set ((x, y), (x, y, sample_weight), a tf.data.Dataset, a PyDataset or a "
            "generator) or every value an input of the model. Fix: give each set as (x, y), e.g. "
            'validation_data={"easy": (x_easy, y_easy), "hard": (x_hard, y_hard)}.'
        )
    return False  # the model's inputs by name, as Keras takes them


def _is_a_set(value: Any) -> bool:
    """Whether a dict value is a validation set of its own (data with labels, or a source of batches)."""
    return isinstance(value, (tuple, list, tf.data.Dataset, collections.abc.Iterator, keras.utils.Sequence))


def _names(data: dict[Any, Any]) -> dict[Any, str]:
    """Each key's name in the logs: stripped, other characters than ``[0-9A-Za-z_]`` as ``_``."""
    names: dict[Any, str] = {}
    for key in data:
        if not isinstance(key, str):
            raise ValueError(
                f"fit(validation_data=dict) names its sets with strings; received the key {key!r} of type "
                f'{type(key).__name__}. Fix: use a string, e.g. {{"set_{key}": ...}}.'
            )
        name = _NOT_KEPT.sub("_", key.strip())
        if not name.strip("_"):
            raise ValueError(
                f"fit(validation_data=dict) received the set name {key!r}, which has no letter or digit. "
                'Expected a name for the logs, e.g. "hard" (logged as val_hard_loss). Fix: rename the set.'
            )
        twice = [other for other, other_name in names.items() if other_name == name]
        if twice:
            raise ValueError(
                f"fit(validation_data=dict) received the sets {twice[0]!r} and {key!r}, which are both logged as "
                f"val_{name}_*. Expected names that differ in their letters, digits or '_'. Fix: rename one."
            )
        names[key] = name
    return names


def _check_log_names(names: list[str], output_names: list[str]) -> None:
    """Refuses set names that make two sets' log names the same (``a`` + output ``b_loss``, set ``a_b``)."""
    for name in names:
        for other in names:
            for output in output_names:
                if other == f"{name}_{output}" or other.startswith(f"{name}_{output}_"):
                    raise ValueError(
                        f"fit(validation_data=dict): the sets {name!r} and {other!r} would log values under the same "
                        f"names: the model's output {output!r} makes set {name!r} log val_{name}_{output}_loss, "
                        f"which set {other!r} logs too. Expected set names that are not another set's name "
                        f"followed by an output name. Fix: rename {other!r}."
                    )


def _for_set(value: int | dict[str, int] | None, name: str, names: dict[Any, str], option: str) -> int | None:
    """``value`` for the set logged as ``name``: the number, or the dict's entry by the set's name (or ``None``).

    The dict's keys are normalised as the sets' names are.
    """
    if not isinstance(value, dict):
        return value
    by_name = {_NOT_KEPT.sub("_", key.strip()) if isinstance(key, str) else key: size for key, size in value.items()}
    unknown = [key for key, normalised in zip(value, by_name, strict=True) if normalised not in names.values()]
    if unknown:
        raise ValueError(
            f"fit({option}=dict) names {', '.join(map(repr, unknown))}, which no validation set has. Expected "
            f"names of validation_data's sets: {', '.join(map(repr, names))}. Fix: use those names."
        )
    return by_name.get(name)
