"""The incremental engine-log reader under a stable name (the watcher imports it from here); the readers themselves
are specmon.formats.engine_log (text logs) and specmon.formats.engine_json (JSON responses)."""
from specmon.formats.engine_log import EngineLogReader
from specmon.formats.engine_window import EngineWindow

__all__ = ["EngineLogReader", "EngineWindow"]
