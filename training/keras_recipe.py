"""The training recipe of a Keras fit (`train`): optimiser, learning-rate schedule, weight decay, label
smoothing, gradient accumulation, the moving average of the weights and the metrics as `FitOptions` names
them, so a TensorFlow run follows the rules `train_torch` follows (training/runs.py holds them; this module
only says them in tf-keras's terms).
"""

from __future__ import annotations

import contextlib

from .keras_env import tensorflow  # must precede TensorFlow

tf = tensorflow()
import tf_keras as keras

from .runs import SGD_MOMENTUM, TOP_K, FitOptions, decays, reports_top_k


class _TensorFlowMath:
    """`FitOptions.learning_rate_at`'s math on a step tensor, inside the compiled step."""
    minimum, maximum, cos = staticmethod(tf.minimum), staticmethod(tf.maximum), staticmethod(tf.cos)

    @staticmethod
    def as_float(step):
        return tf.cast(step, tf.float32)

    @staticmethod
    def reached(step, milestone):
        return tf.cast(step >= milestone, tf.float32)


class LearningRates(keras.optimizers.schedules.LearningRateSchedule):
    """The rate of each step from the optimiser's step counter, which a backup restores with the weights: a
    resumed or progressively resized fit goes on with the rates an uninterrupted one would have used."""

    def __init__(self, recipe: FitOptions, steps_per_epoch: int):
        self.recipe, self.steps_per_epoch = recipe, int(steps_per_epoch)

    def __call__(self, step):
        return self.recipe.learning_rate_at(step, self.steps_per_epoch, _TensorFlowMath)

    def get_config(self) -> dict:
        return {"learning_rate": self.recipe.learning_rate, "lr_schedule": self.recipe.lr_schedule,
                "warmup_epochs": self.recipe.warmup_epochs, "steps_per_epoch": self.steps_per_epoch}


class _SGDWithL2(keras.optimizers.SGD):
    """SGD whose `weight_decay` is L2 on the gradient (through the momentum, as torch's SGD and the ResNet
    recipe have it), not Keras's decoupled decay; only for the weights `decays` names. The gradient here
    is the replicas' sum already, so the decay is added once."""

    def __init__(self, learning_rate, *, l2: float, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.l2 = float(l2)

    def update_step(self, gradient, variable):
        if decays(variable.shape):
            gradient = gradient + self.l2 * tf.cast(variable, gradient.dtype)
        return super().update_step(gradient, variable)


def optimizer(recipe: FitOptions, steps_per_epoch: int, model: keras.Model) -> keras.optimizers.Optimizer:
    """SGD with momentum (and L2) or Adam (AdamW with a decay), at a fixed rate or `LearningRates`; with
    ``ema_decay``, tf-keras's moving average of the weights inside the compiled step (`averaged_weights`)."""
    rate = LearningRates(recipe, steps_per_epoch) if recipe.scheduled else recipe.learning_rate
    average = dict(use_ema=True, ema_momentum=float(recipe.ema_decay)) if recipe.ema_decay else {}
    if recipe.optimizer == "sgd":
        if recipe.weight_decay:
            made = _SGDWithL2(rate, momentum=SGD_MOMENTUM, l2=recipe.weight_decay, **average)
        else:
            made = keras.optimizers.SGD(rate, momentum=SGD_MOMENTUM, **average)
    elif not recipe.weight_decay:
        made = keras.optimizers.Adam(rate, **average)
    else:
        made = keras.optimizers.AdamW(rate, weight_decay=recipe.weight_decay, **average)
        made.exclude_from_weight_decay(var_list=[v for v in model.trainable_variables if not decays(v.shape)])
    if average:
        # tf-keras ends every fit by overwriting the weights with their average: a run keeps both (the average
        # is written to a file of its own), and a progressive run's next phase goes on from the weights
        made.finalize_variable_values = _keep_the_weights
    return made


def _keep_the_weights(var_list) -> None:
    """`finalize_variable_values` that leaves the model's weights as they were trained."""


# The optimiser's attribute holding `average_statistics`'s averages: tracked with the optimiser's own state, they
# are in every checkpoint of the model (backups, the hand-over between a schedule's phases).
STATISTICS_AVERAGES = "statistics_moving_average"


def _inner_optimizer(model: keras.Model):
    return getattr(model.optimizer, "inner_optimizer", model.optimizer)   # under a LossScaleOptimizer


def _moving_averages(model: keras.Model) -> list:
    """(weight, its moving average) for each trainable weight, from the optimiser `optimizer` made, and for
    each statistic `average_statistics` averages."""
    inner = _inner_optimizer(model)
    averages = getattr(inner, "_model_variables_moving_average", None)   # made when the optimiser is built
    if not getattr(inner, "use_ema", False) or averages is None:
        raise ValueError(f"{model.name}'s optimizer keeps no moving average of its weights (ema_decay)")
    pairs = [(weight, averages[inner._index_dict[inner._var_key(weight)]]) for weight in model.trainable_variables]
    return pairs + list(zip(_statistics(model), getattr(inner, STATISTICS_AVERAGES, [])))


def _statistics(model: keras.Model) -> list:
    """The statistics a model keeps besides its weights: its non-trainable floats (batch norm's moving mean and
    variance), as torch's buffers."""
    return [weight for weight in model.non_trainable_weights if weight.dtype.is_floating]


def average_statistics(model: keras.Model) -> keras.Model:
    """With ``ema_decay``, also keep a moving average of the compiled `model`'s batch-norm statistics, at the
    weights' rate, after each optimizer step inside the compiled step, as `train_torch`'s
    ``AveragedModel(use_buffers=True)`` does: tf-keras averages trainable weights only, and the averaged weights
    of a network with batch norm do not fit the statistics of the weights trained. Each replica averages its own
    statistics (synchronised on read, as batch norm keeps them: no extra all-reduce a step); read, they are the
    replicas' mean. Call it inside the strategy's scope, after `accumulate`."""
    inner = _inner_optimizer(model)
    statistics = _statistics(model)
    if not getattr(inner, "use_ema", False) or not statistics:
        return model
    momentum = float(inner.ema_momentum)
    averages = [tf.Variable(statistic.read_value(), trainable=False, name=statistic.name.split(":")[0] + "/average",
                            synchronization=statistic.synchronization, aggregation=statistic.aggregation)
                for statistic in statistics]
    setattr(inner, STATISTICS_AVERAGES, averages)
    step = model.train_step

    def train_step(data):
        logs = step(data)   # its forward passes update the statistics; ops on a variable run in program order
        for average, statistic in zip(averages, statistics):
            average.assign(momentum * average + (1.0 - momentum) * statistic)
        return logs

    model.train_step = train_step
    return model


@contextlib.contextmanager
def averaged_weights(model: keras.Model):
    """Inside the block the model's trainable weights hold their moving average (``ema_decay``), as tf-keras's
    optimiser keeps it, and its batch-norm statistics theirs where `average_statistics` keeps them; the weights
    and statistics are back afterwards."""
    pairs = _moving_averages(model)
    trained = [weight.numpy() for weight, _ in pairs]
    for weight, average in pairs:
        weight.assign(average.read_value())
    try:
        yield model
    finally:
        for (weight, _), value in zip(pairs, trained):
            weight.assign(value)


def accumulate(model: keras.Model, batches: int) -> keras.Model:
    """Make each training step of the compiled `model` cut its batch in `batches` slices and sum their gradients
    before one optimizer update (``accumulate_batches``): a slice's forward pass waits for the previous slice's
    gradients, so the slices do not run side by side, each holding its activations. `train` uses it on one
    replica only (docs/training.md says why). The optimiser's step counter, the learning-rate schedule, weight
    decay and the moving average count optimizer steps. Batch-norm statistics are those of each slice, as with a
    smaller batch. A batch must divide into `batches` slices."""
    if batches == 1:
        return model
    scaled = isinstance(model.optimizer, keras.mixed_precision.LossScaleOptimizer)

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        divides = tf.debugging.assert_equal(tf.shape(x)[0] % batches, 0, message=(
            f"accumulate_batches={batches}: a batch does not cut into {batches} equal slices (its size must be a "
            f"multiple of {batches})"))
        variables = model.trainable_variables
        with tf.control_dependencies([divides] if divides is not None else []):   # checked before the cut
            slices = [tf.split(part, batches) if part is not None else [None] * batches
                      for part in (x, y, sample_weight)]
        sums, previous = [tf.zeros_like(v) for v in variables], []
        for xs, ys, weights in zip(*slices):
            with tf.control_dependencies(previous):   # this slice starts once the previous one's gradients exist
                xs = tf.identity(xs)
            with tf.GradientTape() as tape:
                predicted = model(xs, training=True)
                loss = model.compute_loss(xs, ys, predicted, weights) / batches   # the step's mean over its slices
                if scaled:
                    loss = model.optimizer.get_scaled_loss(loss)
            gradients = tape.gradient(loss, variables)
            if scaled:
                gradients = model.optimizer.get_unscaled_gradients(gradients)
            sums = [total if g is None else total + g for total, g in zip(sums, gradients)]
            previous = [g for g in gradients if g is not None]
            model.compute_metrics(xs, ys, predicted, weights)
        model.optimizer.apply_gradients(zip(sums, variables))
        return model.get_metrics_result()

    model.train_step = train_step
    return model


class AverageValidation(keras.callbacks.Callback):
    """Adds ``val_ema_*``: the moving average of the weights evaluated on the validation data after each epoch,
    as `train_torch` does. `validation(size)`: the validation dataset at the model's image size (a
    progressive run's phases differ)."""

    def __init__(self, validation):
        super().__init__()
        self.validation = validation

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        with averaged_weights(self.model):
            scores = self.model.evaluate(self.validation(int(self.model.input_shape[1])), verbose=0, return_dict=True)
        logs.update({f"val_ema_{name}": float(value) for name, value in scores.items()})


class _SmoothedCrossentropy(keras.losses.Loss):
    """Sparse labels against the model's probabilities, each target smoothed (`label_smoothing`): tf-keras's
    sparse loss has no smoothing, so the labels become one-hot first."""

    def __init__(self, num_classes: int, smoothing: float, name: str = "smoothed_crossentropy"):
        super().__init__(name=name)
        self.num_classes, self.smoothing = int(num_classes), float(smoothing)

    def call(self, y_true, y_pred):
        targets = tf.one_hot(tf.cast(tf.reshape(y_true, [-1]), tf.int32), self.num_classes, dtype=y_pred.dtype)
        return keras.losses.categorical_crossentropy(targets, y_pred, label_smoothing=self.smoothing)

    def get_config(self) -> dict:
        return {**super().get_config(), "num_classes": self.num_classes, "smoothing": self.smoothing}


def loss(recipe: FitOptions, num_classes: int) -> keras.losses.Loss:
    """The training loss: sparse cross-entropy, smoothed where `label_smoothing` asks."""
    if recipe.label_smoothing:
        return _SmoothedCrossentropy(num_classes, recipe.label_smoothing)
    return keras.losses.SparseCategoricalCrossentropy()


def metrics(num_classes: int) -> list:
    """Accuracy, and top-5 accuracy (``top5_accuracy``) where `reports_top_k`, as `train_torch` reports them."""
    if not reports_top_k(num_classes):
        return ["accuracy"]
    return ["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=TOP_K, name="top5_accuracy")]


class LearningRateLog(keras.callbacks.Callback):
    """Adds ``learning_rate`` (that of the epoch's last step, by the optimiser's step counter) to each epoch's
    logs, as `train_torch` does."""

    def __init__(self, recipe: FitOptions, steps_per_epoch: int):
        super().__init__()
        self.recipe, self.steps_per_epoch = recipe, int(steps_per_epoch)

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            last = int(keras.backend.get_value(self.model.optimizer.iterations)) - 1
            logs["learning_rate"] = float(self.recipe.learning_rate_at(last, self.steps_per_epoch))


__all__ = ["AverageValidation", "LearningRateLog", "LearningRates", "accumulate", "average_statistics", "averaged_weights",
           "loss", "metrics", "optimizer"]
