"""Select tf-keras (Keras 2) before TensorFlow loads.

Keras 3 breaks under MultiWorkerMirroredStrategy (keras-team/keras#20585) and in some
2-device MirroredStrategy fits (keras#21069); tf-keras works for every strategy, so pinstorm
uses it everywhere. ``tf.keras`` reads ``TF_USE_LEGACY_KERAS`` the first time it is touched,
so this module must be imported before anything imports TensorFlow; every training module
that imports TensorFlow imports this one first, and the modules themselves use ``tf_keras``
directly, which is Keras 2 whatever the variable says.
"""

from __future__ import annotations

import os

os.environ["TF_USE_LEGACY_KERAS"] = "1"

# TensorFlow's C++ INFO and WARNING lines (oneDNN, "could not find cuda drivers") bury pinstorm's
# own output; errors still show. A user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
