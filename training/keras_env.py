"""Select tf-keras (Keras 2) before TensorFlow loads, and load TensorFlow without its start-up noise.

Keras 3 breaks under MultiWorkerMirroredStrategy (keras-team/keras#20585) and in some
2-device MirroredStrategy fits (keras#21069); tf-keras works for every strategy, so pinstorm
uses it everywhere. ``tf.keras`` reads ``TF_USE_LEGACY_KERAS`` the first time it is touched,
so this module must be imported before anything imports TensorFlow; every training module
that imports TensorFlow imports this one first, and the modules themselves use ``tf_keras``
directly, which is Keras 2 whatever the variable says.

Training modules get TensorFlow from ``tensorflow()`` (`pinstorm.tensorflow_quiet`, re-exported
here), which hides TensorFlow's start-up noise. Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

from pinstorm.tensorflow_quiet import (  # noqa: E402,F401  (after the variable; re-exported for training)
    NVIDIA_DRIVER, filtered_stderr, has_nvidia_driver, is_noise, min_log_level, tensorflow)
