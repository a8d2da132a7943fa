"""AlexNet as published (scalable down to small inputs and CPUs) and modern Keras models.

AlexNet follows Krizhevsky, Sutskever & Hinton (2012): five convolutions (96-256-384-384-256
filters, the first 11x11 with stride 4), local response normalisation after the first two,
overlapping 3x3/2 max pooling, two dropout-regularised dense layers of 4096 units and a softmax.
``width`` scales every filter and unit count and small inputs get a gentler stem, so the same
network trains on 32-64 pixel images on a laptop CPU. Models whose layers would run in float16
(mixed precision on GPUs) keep their final softmax in float32 for a stable loss.
"""

from __future__ import annotations

from .keras_env import tensorflow  # must precede TensorFlow
from .errors import TrainingError

from typing import Callable

tf = tensorflow()   # imported without its start-up noise (see keras_env)
import tf_keras as keras

from .shapes import alexnet_stem


class ModelError(TrainingError, ValueError):
    """A model was asked for by a name or with a shape it cannot be built with."""


@keras.utils.register_keras_serializable(package="pinstorm")
class LocalResponseNormalization(keras.layers.Layer):
    """AlexNet's cross-channel local response normalisation (n=5, k=2, alpha=1e-4, beta=0.75).

    TensorFlow's ``alpha`` multiplies the plain sum over the window, as in the paper.
    """

    def __init__(self, depth_radius=2, bias=2.0, alpha=1e-4, beta=0.75, **kwargs):
        super().__init__(**kwargs)
        self.depth_radius, self.bias, self.alpha, self.beta = depth_radius, bias, alpha, beta

    def call(self, inputs):
        return tf.nn.local_response_normalization(
            inputs, depth_radius=self.depth_radius, bias=self.bias, alpha=self.alpha, beta=self.beta
        )

    def get_config(self):
        config = super().get_config()
        config.update(depth_radius=self.depth_radius, bias=self.bias, alpha=self.alpha, beta=self.beta)
        return config


def _stem(side: int) -> tuple[int, int]:
    """(kernel, stride) of AlexNet's first convolution (`shapes.alexnet_stem`, shared by both frameworks)."""
    stem = alexnet_stem(side)
    if stem is None:
        raise ModelError(f"AlexNet needs inputs of at least 24x24 pixels, got {side}x{side}")
    return stem


def _normalize(kind: str | None, name: str):
    if kind == "lrn":
        return LocalResponseNormalization(name=name)
    if kind == "batch":
        return keras.layers.BatchNormalization(name=name)
    if kind is None or kind == "none":
        return None
    raise ModelError(f"unknown normalization {kind!r}: use 'lrn' (as published), 'batch' or None")


# The ReLU layers start He-uniform (He et al. 2015: variance 2/fan_in keeps the signal's scale through
# ReLUs); with Keras's default, Glorot, it halves at each of AlexNet's seven, and the demo's digits AlexNet
# sat at chance for 1-4 of its 12 epochs (in 1 run of 15, all 12). The softmax layer keeps Glorot.
# torch_models starts the same way.
RELU_INIT = "he_uniform"


def alexnet(
    input_shape=(224, 224, 3),
    num_classes: int = 1000,
    *,
    width: float = 1.0,
    dense_units: int | None = None,
    dropout: float = 0.5,
    normalization: str | None = "lrn",
    name: str = "alexnet",
) -> keras.Model:
    """AlexNet; ``width`` < 1 shrinks every layer (e.g. 0.25 for CPUs), inputs from 24 px up."""
    if width <= 0:
        raise ModelError(f"width must be positive, got {width}")
    height, side_w, _channels = input_shape
    kernel, stride = _stem(min(height, side_w))
    filters = [max(8, int(round(f * width))) for f in (96, 256, 384, 384, 256)]
    units = dense_units or max(16, int(round(4096 * width)))

    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    if stride == 4:  # 224 + 2*2 padding -> 55x55 maps, as in the paper's 6x6x256 before the dense layers
        x = keras.layers.ZeroPadding2D(2, name="pad1")(x)
    x = keras.layers.Conv2D(filters[0], kernel, strides=stride, padding="same" if stride < 4 else "valid",
                            activation="relu", kernel_initializer=RELU_INIT, name="conv1")(x)
    norm = _normalize(normalization, "norm1")
    x = norm(x) if norm is not None else x
    x = keras.layers.MaxPooling2D(3, strides=2, name="pool1")(x)
    x = keras.layers.Conv2D(filters[1], 5, padding="same", activation="relu", kernel_initializer=RELU_INIT,
                            name="conv2")(x)
    norm = _normalize(normalization, "norm2")
    x = norm(x) if norm is not None else x
    x = keras.layers.MaxPooling2D(3, strides=2, name="pool2")(x)
    x = keras.layers.Conv2D(filters[2], 3, padding="same", activation="relu", kernel_initializer=RELU_INIT,
                            name="conv3")(x)
    x = keras.layers.Conv2D(filters[3], 3, padding="same", activation="relu", kernel_initializer=RELU_INIT,
                            name="conv4")(x)
    x = keras.layers.Conv2D(filters[4], 3, padding="same", activation="relu", kernel_initializer=RELU_INIT,
                            name="conv5")(x)
    x = keras.layers.MaxPooling2D(3, strides=2, name="pool5")(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dropout(dropout, name="drop6")(x)
    x = keras.layers.Dense(units, activation="relu", kernel_initializer=RELU_INIT, name="fc6")(x)
    x = keras.layers.Dropout(dropout, name="drop7")(x)
    x = keras.layers.Dense(units, activation="relu", kernel_initializer=RELU_INIT, name="fc7")(x)
    x = keras.layers.Dense(num_classes, name="fc8")(x)
    outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)
    return keras.Model(inputs, outputs, name=name)


def _application(constructor_name: str, min_side: int):
    def build(input_shape=(224, 224, 3), num_classes: int = 1000, **kwargs) -> keras.Model:
        if min(input_shape[:2]) < min_side:
            raise ModelError(f"{constructor_name} needs inputs of at least {min_side}x{min_side}, got {input_shape}")
        constructor = getattr(keras.applications, constructor_name)
        # weights=None: nothing may be downloaded; the float32 softmax keeps mixed precision stable.
        base = constructor(include_top=True, weights=None, input_shape=tuple(input_shape),
                           classes=num_classes, classifier_activation=None, **kwargs)
        outputs = keras.layers.Activation("softmax", dtype="float32", name="probabilities")(base.output)
        return keras.Model(base.input, outputs, name=base.name)

    build.__name__ = constructor_name.lower()
    build.__doc__ = f"keras.applications.{constructor_name} from scratch (weights=None)."
    return build


resnet50 = _application("ResNet50", 32)
mobilenet_v2 = _application("MobileNetV2", 32)

MODELS: dict[str, Callable[..., keras.Model]] = {
    "alexnet": alexnet,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
}


def build_model(name: str, input_shape=(224, 224, 3), num_classes: int = 1000, **kwargs) -> keras.Model:
    """Build a model by name (``alexnet``, ``resnet50``, ``mobilenet_v2``); kwargs go to its builder.

    Call it inside ``strategy.scope()`` so the variables are mirrored.

    Args:
        name: ``"alexnet"``, ``"resnet50"`` or ``"mobilenet_v2"``.
        input_shape: ``(height, width, 3)``.
        num_classes: Output classes.
        **kwargs: For the builder, e.g. AlexNet's ``width``, ``normalization``, ``dropout``.

    Returns:
        An uncompiled ``keras.Model``.
    """
    key = name.lower().replace("-", "_")
    if key == "resnet_50":
        key = "resnet50"
    if key not in MODELS:
        raise ModelError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    if isinstance(input_shape, int):
        input_shape = (input_shape, input_shape, 3)
    if num_classes < 2:
        raise ModelError(f"num_classes must be at least 2, got {num_classes}")
    return MODELS[key](tuple(input_shape), num_classes, **kwargs)
