"""AlexNet and a small ResNet in plain ``torch.nn``, for ``train_torch`` (no torchvision needed).

AlexNet mirrors ``training.models.alexnet`` layer for layer: the same ``width`` multiplier, the same
gentler stem below 128 px (so the demo's 32 px digits fit), LRN after the first two convolutions,
overlapping 3x3/2 pooling, two dropout-regularised dense layers. Weights start as ``models.alexnet``'s
(He-uniform before each ReLU, Glorot-uniform in the last layer, zero biases), so the two frameworks train
the same network from the same kind of start. Models return logits ([B, classes]); the loss applies the
softmax. Inputs are [B, 3, H, W].

``resnet50`` is torchvision's ResNet-50 where torchvision is installed, else `ResNet50` of the same shape.
``resnet_small`` is a CIFAR-style ResNet (He et al. 2016, section 4.2): a 3x3 stem, three stages of
basic blocks at 16/32/64 x ``width`` filters, global average pooling; any input from 8 px up.
Importing this module imports torch (``pinstorm.training`` loads it only when asked for).
"""

from __future__ import annotations

from typing import Callable

from pinstorm.extras import require

from .errors import TrainingError
from .shapes import alexnet_stem

torch = require("torch", "torch", "pinstorm.training.torch_models")
nn = torch.nn


class TorchModelError(TrainingError, ValueError):
    """A model was asked for by a name or with a shape it cannot be built with."""


def _stem(side: int) -> tuple[int, int]:
    """(kernel, stride) of AlexNet's first convolution (`shapes.alexnet_stem`, shared by both frameworks)."""
    stem = alexnet_stem(side)
    if stem is None:
        raise TorchModelError(f"AlexNet needs inputs of at least 24x24 pixels, got {side}x{side}")
    return stem


class ChannelLRN(nn.Module):
    """``nn.LocalResponseNorm`` (the same formula, window and padding; equal to rounding) as one 1x1
    convolution of the squares with a banded 0/1 matrix, where torch's pads and average-pools in 3-D: on
    2 CPUs the layer takes 0.46-0.48x the time, an AlexNet training step 0.76x (bench/bench_torch_lrn.py).

    Args:
        size: Channels summed over, centred as torch centres them (``size // 2`` before, the rest after).
        alpha: Scale of the sum, divided by `size` (torch's convention).
        beta: Exponent.
        k: Additive constant.
    """

    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, x):
        # in float32 under mixed precision: a sum of squares overflows float16 long before the activations do
        device = x.device.type
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
            with torch.autocast(device, enabled=False):
                return self._normalized(x)
        return self._normalized(x)

    def _normalized(self, x):
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        channels = torch.arange(x.shape[1], device=x.device)
        offset = channels[None, :] - channels[:, None]    # [out, in]: input channel minus output channel
        band = ((offset >= -(self.size // 2)) & (offset <= (self.size - 1) // 2)).to(wide.dtype)
        sums = torch.nn.functional.conv2d(wide * wide, band[:, :, None, None])
        return (wide / (self.k + (self.alpha / self.size) * sums).pow(self.beta)).to(x.dtype)


def _normalize(kind: str | None, channels: int) -> nn.Module:
    if kind == "lrn":
        # torch divides alpha by the window size, TensorFlow (and the paper) does not: 5 x 1e-4 here is theirs
        return ChannelLRN(size=5, alpha=5e-4, beta=0.75, k=2.0)
    if kind == "batch":
        return nn.BatchNorm2d(channels)
    if kind is None or kind == "none":
        return nn.Identity()
    raise TorchModelError(f"unknown normalization {kind!r}: use 'lrn' (as published), 'batch' or None")


def _alexnet_init(model: nn.Module) -> None:
    """``models.alexnet``'s start (see its ``RELU_INIT``): He-uniform before ReLUs (Keras's ``he_uniform``,
    bound sqrt(6 / fan_in)), Glorot-uniform in the last layer, zero biases."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    for layer in layers:
        if layer is layers[-1]:
            nn.init.xavier_uniform_(layer.weight)
        else:
            nn.init.kaiming_uniform_(layer.weight, nonlinearity="relu")
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)


class AlexNet(nn.Module):
    """AlexNet for ``image_size`` inputs; ``width`` < 1 shrinks every layer (e.g. 0.25 for CPUs)."""

    def __init__(self, num_classes: int = 1000, image_size: int = 224, *, width: float = 1.0,
                 dense_units: int | None = None, dropout: float = 0.5, normalization: str | None = "lrn"):
        super().__init__()
        if width <= 0:
            raise TorchModelError(f"width must be positive, got {width}")
        kernel, stride = _stem(int(image_size))
        filters = [max(8, int(round(f * width))) for f in (96, 256, 384, 384, 256)]
        units = dense_units or max(16, int(round(4096 * width)))
        # stride 4: the paper's 2-pixel zero padding and a "valid" convolution; below, "same" padding
        padding = 2 if stride == 4 else kernel // 2
        self.features = nn.Sequential(
            nn.Conv2d(3, filters[0], kernel, stride=stride, padding=padding), nn.ReLU(inplace=True),
            _normalize(normalization, filters[0]), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(filters[0], filters[1], 5, padding=2), nn.ReLU(inplace=True),
            _normalize(normalization, filters[1]), nn.MaxPool2d(3, stride=2),
            nn.Conv2d(filters[1], filters[2], 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(filters[2], filters[3], 3, padding=1), nn.ReLU(inplace=True),
            nn.Conv2d(filters[3], filters[4], 3, padding=1), nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
        )
        with torch.no_grad():   # the flattened size for this input size, without arithmetic to get wrong
            flat = self.features(torch.zeros(1, 3, int(image_size), int(image_size))).numel()
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Dropout(dropout), nn.Linear(flat, units), nn.ReLU(inplace=True),
            nn.Dropout(dropout), nn.Linear(units, units), nn.ReLU(inplace=True), nn.Linear(units, num_classes),
        )
        _alexnet_init(self)

    def forward(self, images):
        return self.classifier(self.features(images))


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or 1x1 projection) shortcut."""

    expansion = 1   # output channels per unit of width

    def __init__(self, channels_in: int, channels_out: int, stride: int = 1):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(channels_out), nn.ReLU(inplace=True),
            nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False), nn.BatchNorm2d(channels_out),
        )
        self.shortcut = _shortcut(channels_in, channels_out, stride)

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def _shortcut(channels_in: int, channels_out: int, stride: int) -> nn.Module:
    """A residual block's shortcut: the identity, or a strided 1x1 projection where the shape changes."""
    if stride == 1 and channels_in == channels_out:
        return nn.Identity()
    return nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False),
                         nn.BatchNorm2d(channels_out))


class _ResNet(nn.Module):
    """What ResNet-20 and ResNet-50 share: a stem, stages of residual blocks (each later stage's first block
    strided), global average pooling, a linear classifier, He-initialised convolutions."""

    def __init__(self, stem: list, stages, block: type, num_classes: int):
        """`stages`: (width, blocks) each; `block(channels_in, width, stride)` outputs width x ``block.expansion``."""
        super().__init__()
        layers: list[nn.Module] = list(stem)
        previous = next(m.out_channels for m in stem if isinstance(m, nn.Conv2d))
        for stage, (width, blocks) in enumerate(stages):
            for index in range(blocks):
                layers.append(block(previous, width, stride=2 if stage and not index else 1))
                previous = width * block.expansion
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(previous, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images):
        return self.classifier(self.features(images))


class ResNetSmall(_ResNet):
    """CIFAR-style ResNet-(6n+2): ``blocks`` = n per stage (3 gives ResNet-20), 16/32/64 x ``width`` filters."""

    def __init__(self, num_classes: int = 10, image_size: int = 32, *, width: float = 1.0, blocks: int = 3):
        if int(image_size) < 8:
            raise TorchModelError(f"resnet_small needs inputs of at least 8x8 pixels, got {image_size}")
        if width <= 0 or blocks < 1:
            raise TorchModelError(f"width and blocks must be positive, got {width}, {blocks}")
        channels = [max(4, int(round(c * width))) for c in (16, 32, 64)]
        stem = [nn.Conv2d(3, channels[0], 3, padding=1, bias=False), nn.BatchNorm2d(channels[0]), nn.ReLU(inplace=True)]
        super().__init__(stem, [(c, blocks) for c in channels], BasicBlock, num_classes)


class Bottleneck(nn.Module):
    """ResNet-50's block: 1x1 reduce, 3x3 (stride here, as torchvision's "v1.5"), 1x1 expand by 4."""

    expansion = 4

    def __init__(self, channels_in: int, width: int, stride: int = 1):
        super().__init__()
        out = width * self.expansion
        self.body = nn.Sequential(
            nn.Conv2d(channels_in, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
            nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False), nn.BatchNorm2d(width),
            nn.ReLU(inplace=True), nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = _shortcut(channels_in, out, stride)

    forward = BasicBlock.forward


class ResNet50(_ResNet):
    """ResNet-50 (He et al. 2016) in torchvision's layout ("v1.5": stride in the 3x3), 25,557,032 parameters
    at 1,000 classes: the field's reference model, used when torchvision is not installed."""

    def __init__(self, num_classes: int = 1000, image_size: int = 224):
        if int(image_size) < 32:
            raise TorchModelError(f"resnet50 needs inputs of at least 32x32 pixels, got {image_size}")
        stem = [nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                nn.MaxPool2d(3, stride=2, padding=1)]
        super().__init__(stem, ((64, 3), (128, 4), (256, 6), (512, 3)), Bottleneck, num_classes)


def resnet50(num_classes: int = 1000, image_size: int = 224) -> nn.Module:
    """torchvision's ResNet-50 where torchvision imports, else `ResNet50` (the same shape and parameters)."""
    try:
        from torchvision.models import resnet50 as torchvision_resnet50
    except Exception:   # noqa: BLE001 - not installed, or built for another torch
        return ResNet50(num_classes, image_size)
    if int(image_size) < 32:
        raise TorchModelError(f"resnet50 needs inputs of at least 32x32 pixels, got {image_size}")
    return torchvision_resnet50(num_classes=num_classes)


TORCH_MODELS: dict[str, Callable[..., nn.Module]] = {"alexnet": AlexNet, "resnet_small": ResNetSmall,
                                                     "resnet50": resnet50}


def build_torch_model(name: str, num_classes: int, image_size: int = 224, **kwargs) -> nn.Module:
    """Build a torch model by name (``alexnet``, ``resnet_small``, ``resnet50``); kwargs go to its constructor.

    Args:
        name: ``"alexnet"``, ``"resnet_small"`` or ``"resnet50"``.
        num_classes: Output classes.
        image_size: The input images' side in pixels.
        **kwargs: For the model's constructor, e.g. AlexNet's ``width``.

    Returns:
        A ``torch.nn.Module``.
    """
    key = name.lower().replace("-", "_").replace("resnet_50", "resnet50")
    if key not in TORCH_MODELS:
        raise TorchModelError(f"unknown torch model {name!r}; choose one of {sorted(TORCH_MODELS)}")
    if num_classes < 2:
        raise TorchModelError(f"num_classes must be at least 2, got {num_classes}")
    return TORCH_MODELS[key](num_classes, int(image_size), **kwargs)
