"""Claw-R1 consumer SDK: trainers pull curated, training-ready step batches from the pool.

    from clawr1.consumer_sdk import PoolConsumer

    with PoolConsumer("http://127.0.0.1:8000", "grpo-run-1", token_provenance="engine") as consumer:
        for batch in consumer:
            arrays = batch.to_numpy()
            ...  # train
            consumer.commit()

Needs only numpy, pyarrow, httpx and clickhouse-connect; torch is optional (``StepBatch.to_torch``).
"""

from clawr1.consumer_sdk.batch import PaddedBatch, Step, StepBatch
from clawr1.consumer_sdk.consumer import PoolConsumer
from clawr1.consumer_sdk.engines import EngineControl
from clawr1.consumer_sdk.errors import (
    ConsumerClosed,
    ConsumerError,
    DataError,
    InvalidFilter,
    InvalidSource,
    MissingDependency,
    PoolRequestError,
    PoolUnavailable,
    PresetNotFound,
    TransportError,
    UsageError,
)
from clawr1.consumer_sdk.export import ExportManifest, export_dataset
from clawr1.consumer_sdk.filters import Filters
from clawr1.consumer_sdk.presets import list_presets, load_preset, save_preset

__all__ = [
    "ConsumerClosed",
    "ConsumerError",
    "DataError",
    "EngineControl",
    "ExportManifest",
    "Filters",
    "InvalidFilter",
    "InvalidSource",
    "MissingDependency",
    "PaddedBatch",
    "PoolConsumer",
    "PoolRequestError",
    "PoolUnavailable",
    "PresetNotFound",
    "Step",
    "StepBatch",
    "TransportError",
    "UsageError",
    "export_dataset",
    "list_presets",
    "load_preset",
    "save_preset",
]
