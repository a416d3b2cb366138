"""The engine readers under one stable name (the watcher and older callers import them from here): vLLM, llama.cpp
and SGLang text logs (specmon.formats.engine_log) and per-request JSON responses (specmon.formats.engine_json)."""
from specmon.formats.engine_json import read as read_json_responses
from specmon.formats.engine_log import EngineLogReader, EngineWindow
from specmon.formats.engine_log import read as read_log

__all__ = ["EngineLogReader", "EngineWindow", "read_json_responses", "read_log"]
