"""``hvdlike.keras.callbacks`` is ``hvdlike.tensorflow.keras.callbacks``."""
from hvdlike.tensorflow.keras.callbacks import (  # noqa: F401
    BestModelCheckpoint,
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
    ModelCheckpoint,
    UnevenDataCallback,
)
