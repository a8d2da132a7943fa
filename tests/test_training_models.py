"""AlexNet as published and scaled down; modern models from keras.applications without weights."""

from __future__ import annotations

import pytest

from pinstorm.training.models import ModelError, build_model

pytest_plugins = ["conftest_training"]


def test_alexnet_at_imagenet_size_is_the_published_network():
    model = build_model("alexnet", 224, 1000)
    convs = [layer for layer in model.layers if layer.name.startswith("conv")]
    assert [c.filters for c in convs] == [96, 256, 384, 384, 256]
    assert [c.kernel_size for c in convs] == [(11, 11), (5, 5), (3, 3), (3, 3), (3, 3)]
    assert convs[0].strides == (4, 4)
    assert model.get_layer("pool5").output_shape == (None, 6, 6, 256)       # 9216 features
    assert [model.get_layer(n).units for n in ("fc6", "fc7", "fc8")] == [4096, 4096, 1000]
    assert [model.get_layer(n).rate for n in ("drop6", "drop7")] == [0.5, 0.5]
    assert model.count_params() == 62_378_344                                # the paper's ~60M
    assert model.output.dtype == "float32"


def test_alexnet_scales_down_for_small_inputs():
    model = build_model("alexnet", (32, 32, 3), 10, width=0.25, normalization="batch")
    assert model.output_shape == (None, 10)
    assert model.get_layer("conv1").filters == 24 and model.get_layer("fc6").units == 1024
    assert model.count_params() < 2_000_000
    with pytest.raises(ModelError, match="at least 24x24"):
        build_model("alexnet", 16, 10)
    with pytest.raises(ModelError, match="unknown normalization"):
        build_model("alexnet", 32, 10, normalization="group")


def test_resnet50_from_applications_without_weights():
    model = build_model("ResNet-50", 32, 10)
    assert model.output_shape == (None, 10) and model.output.dtype == "float32"
    assert 23_000_000 < model.count_params() < 24_000_000


def test_unknown_model_and_bad_class_count_are_named():
    with pytest.raises(ModelError, match="unknown model 'vgg16'"):
        build_model("vgg16", 224, 10)
    with pytest.raises(ModelError, match="num_classes"):
        build_model("alexnet", 224, 1)
