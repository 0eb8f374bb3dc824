"""The reference runtime: the engine on the reference model (engine.py and its neighbours), its decode
graphs (decode/) and its piecewise prefill graphs (piecewise/)."""

from harness.records import Generation, Request, Step
from harness.runtime.config import EngineConfig
from harness.runtime.engine import Engine
from harness.runtime.stats import BatchRecord, EngineStats
from harness.runtime.validation import BadRequestError

__all__ = ["BadRequestError", "BatchRecord", "Engine", "EngineConfig", "EngineStats", "Generation",
           "Request", "Step"]
