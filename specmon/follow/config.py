"""What `specmon watch` follows: one SourceConfig per source, from the command line or a TOML file."""
from __future__ import annotations

import os
import tomllib
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from specmon.core.faults import SpecmonError
from specmon.core.settings import DEFAULT_STALE_AFTER_S

KINDS = ("log", "steplog", "inbox", "prometheus", "scrape")
# The kinds located by a URL rather than a path.
URL_KINDS = ("prometheus", "scrape")
# Kinds whose location is a path on this machine.
FILE_KINDS = ("log", "steplog", "inbox")
# Where the watcher writes its log lines (the CLI: stdout with a time stamp).
Log = Callable[[str], None]


DEFAULT_INTERVAL_S = 1.0


DEFAULT_PROMETHEUS_LOOKBACK_S = 6 * 3600.0


DEFAULT_PROMETHEUS_STEP_S = 15.0


# Alarms and statuses are re-evaluated at most this often per run (an analysis reads the whole run).
DEFAULT_ALARM_EVERY_S = 5.0


DEFAULT_OUTBOX_MAX_AGE_S = 24 * 3600.0
# Well under Alertmanager's default resolve_timeout of 5 minutes, after which an alert not posted again resolves.
DEFAULT_ALERT_RESEND_S = 60.0


@dataclass
class SourceConfig:
    """One followed source. kind: log (an engine's log), steplog, inbox (a folder), prometheus (a Prometheus
    server's URL) or scrape (an engine's own /metrics URL)."""

    kind: str
    location: str
    run: str | None = None
    template: str | None = None
    c: float | None = None
    skip_bad: bool = False
    step_s: float = DEFAULT_PROMETHEUS_STEP_S  # prometheus: sample spacing
    lookback_s: float = DEFAULT_PROMETHEUS_LOOKBACK_S  # prometheus: how far back the first pull reaches
    baseline_of: str | None = None  # the source's engine runs without speculation, the baseline of this run
    interval_s: float | None = None  # scrape: seconds between scrapes (None: every poll of the watcher)

    @cached_property
    def key(self) -> str:
        """What names the source in the database: its kind and, for a file or folder, the path resolved (absolute,
        symlinks followed, as when it was first asked for), so that a.log, ./a.log and /abs/a.log are one source
        and a restart with another spelling resumes where the last one stopped."""
        return f"{self.kind}:{os.path.realpath(self.location) if self.kind in FILE_KINDS else self.location}"

    def identity(self) -> tuple:
        """What makes two sources one: the file's device and inode where it exists (a hard link, or a symlink
        that realpath cannot see through once the link is replaced, is the same file), else the key."""
        if self.kind in FILE_KINDS:
            try:
                st = os.stat(self.location)
                return self.kind, st.st_dev, st.st_ino
            except OSError:
                pass
        return (self.key,)

    @property
    def run_name(self) -> str:
        if self.run:
            return self.run
        if self.kind == "prometheus":
            return "prometheus"
        if self.kind == "scrape":  # the engine's host:port
            return urllib.parse.urlsplit(self.location).netloc or "scrape"
        return Path(self.location).stem or "default"


@dataclass
class WatchConfig:
    sources: list[SourceConfig] = field(default_factory=list)
    interval_s: float = DEFAULT_INTERVAL_S
    stale_after_s: float = DEFAULT_STALE_AFTER_S
    webhook: str | None = None
    dashboard_url: str = ""  # prefixed to the link path in webhooks, e.g. http://host:8501
    alarm_every_s: float = DEFAULT_ALARM_EVERY_S
    alertmanager: str | None = None  # an Alertmanager's base URL: findings are posted to it as alerts
    outbox_max_age_s: float = DEFAULT_OUTBOX_MAX_AGE_S  # a notice not delivered by then is given up
    alert_resend_s: float = DEFAULT_ALERT_RESEND_S  # firing alerts are posted again this often


def distinct_sources(sources: list[SourceConfig], log: Log) -> list[SourceConfig]:
    """The sources, each file followed once: a later source that is the same file (or folder, or URL) as an
    earlier one under another spelling is merged into it (the first one's settings kept), and the log says so."""
    kept: dict[tuple, SourceConfig] = {}
    for source in sources:
        first = kept.get(source.identity()) or next((k for k in kept.values() if k.key == source.key), None)
        if first is None:
            kept[source.identity()] = source
        else:
            log(f"{source.kind} {source.location}: the same {'folder' if source.kind == 'inbox' else 'file'} as "
                f"{first.location}, followed once (as {first.key}, run {first.run_name!r})")
    return list(kept.values())


def load_config(path: str) -> WatchConfig:
    """A TOML file: top-level interval, stale_after, alarm_every, outbox_max_age, alert_resend (seconds), webhook,
    alertmanager, dashboard_url (all optional),
    and one table per
    source, as arrays of tables named by kind:

        [[log]]
        path = "/var/log/vllm/server.log"
        run = "prod"
        template = "v7"
        c = 0.1

    Tables: [[log]] and [[steplog]] and [[inbox]] take `path`, [[prometheus]] takes `url` (and `step`,
    `lookback` in seconds), [[scrape]] takes `url` (an engine's /metrics) and `interval` (seconds between scrapes);
    every table takes run, template, c, skip_bad and baseline_of (`baseline_of = "RUN"`: the
    source's engine runs without speculation, on the model, hardware and traffic of run RUN)."""
    try:
        with open(path, "rb") as fh:
            doc = tomllib.load(fh)
    except OSError as exc:
        raise SpecmonError(f"{path}: cannot read the watch configuration ({exc.strerror})") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecmonError(f"{path}: not valid TOML ({exc})") from None
    config = WatchConfig()
    known = {"interval", "stale_after", "alarm_every", "webhook", "dashboard_url", "alertmanager", "outbox_max_age",
             "alert_resend", *KINDS}
    unknown = set(doc) - known
    if unknown:
        raise SpecmonError(f"{path}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
    config.interval_s = _number(doc, "interval", DEFAULT_INTERVAL_S, path)
    config.stale_after_s = _number(doc, "stale_after", DEFAULT_STALE_AFTER_S, path)
    config.alarm_every_s = _number(doc, "alarm_every", DEFAULT_ALARM_EVERY_S, path)
    config.webhook = doc.get("webhook")
    config.dashboard_url = doc.get("dashboard_url", "")
    config.alertmanager = doc.get("alertmanager")
    config.outbox_max_age_s = _number(doc, "outbox_max_age", DEFAULT_OUTBOX_MAX_AGE_S, path)
    config.alert_resend_s = _number(doc, "alert_resend", DEFAULT_ALERT_RESEND_S, path)
    for kind in KINDS:
        tables = doc.get(kind, [])
        if isinstance(tables, dict):
            tables = [tables]
        for i, table in enumerate(tables, start=1):
            where = f"{path}: [[{kind}]] #{i}"
            loc_key = "url" if kind in URL_KINDS else "path"
            if not isinstance(table, dict) or not isinstance(table.get(loc_key), str):
                raise SpecmonError(f"{where}: needs {loc_key} = \"...\"")
            allowed = {loc_key, "run", "template", "c", "skip_bad", "step", "lookback", "baseline_of",
                       *(("interval",) if kind == "scrape" else ())}
            extra = set(table) - allowed
            if extra:
                raise SpecmonError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
            baseline_of = table.get("baseline_of")
            if baseline_of is not None and (not isinstance(baseline_of, str) or not baseline_of):
                raise SpecmonError(f"{where}: baseline_of must name a run, got {baseline_of!r}")
            if baseline_of is not None and baseline_of == table.get("run"):
                raise SpecmonError(f"{where}: run {baseline_of!r} cannot be its own baseline_of")
            config.sources.append(SourceConfig(
                kind, table[loc_key], table.get("run"), table.get("template"),
                _optional_number(table, "c", where), bool(table.get("skip_bad", False)),
                _number(table, "step", DEFAULT_PROMETHEUS_STEP_S, where),
                _number(table, "lookback", DEFAULT_PROMETHEUS_LOOKBACK_S, where), baseline_of,
                _optional_number(table, "interval", where)))
    return config


def _optional_number(table: dict, key: str, where: str) -> float | None:
    value = table.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
        raise SpecmonError(f"{where}: {key} must be a number >= 0, got {value!r}")
    return None if value is None else float(value)


def _number(table: dict, key: str, default: float, where: str) -> float:
    value = _optional_number(table, key, where)
    return default if value is None else value
