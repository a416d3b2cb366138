"""One poll of each kind of source: an engine log, a step log, an inbox folder, a Prometheus server. What a poll reads
is stored through the ingest pipeline with the source's new read position in the same transaction."""
from __future__ import annotations

import io
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import orjson

from specmon.core.faults import Fault, SpecmonError
from specmon.core.times import utc_now
from specmon.follow import prometheus_api
from specmon.follow.config import Log, SourceConfig
from specmon.follow.positions import load_position, mark, save_position
from specmon.follow.tail import Chunk, Position, next_chunk, position_after
from specmon.ingest.formats.engine_log import EngineLogReader
from specmon.ingest.formats.engine_window import store_windows
from specmon.ingest.pipeline import Counts, Delivery, IngestResult, ingest_file, ingest_samples, spooled, store_read
from specmon.store.database import Store
from specmon.store.rows import get_or_create_segment

# Suffixes of files still being written into an inbox; they are left alone.
_PARTIAL_SUFFIXES = (".part", ".tmp", ".partial", ".crdownload")



def annotated_template(cur, run: str, ts: datetime) -> str | None:
    """The template a rollout annotation put in force for this run at time ts, if any."""
    rows = cur.execute(
        "SELECT a.template FROM annotations a JOIN runs r USING (run_id) WHERE r.name = ? AND a.starts_at <= ? "
        "ORDER BY a.starts_at DESC, a.annotation_id DESC LIMIT 1", [run, ts]).fetchall()
    return rows[0][0] if rows else None


class SourceStopped(SpecmonError):
    """A source that cannot go on by itself (a bad line without skip_bad): retried only after back-off."""


@dataclass
class PollResult:
    rows: int = 0  # windows, steps or samples stored
    faults: list[Fault] = field(default_factory=list)
    more: bool = False  # a backlog remains: poll again at once


def next_piece(store: Store, source: SourceConfig) -> tuple[Chunk | None, Position]:
    return next_chunk(source.location, load_position(store, source))


def poll_log(store: Store, source: SourceConfig, log: Log) -> PollResult:
    """Read the engine log's new complete lines into engine windows, committed with the new position."""
    chunk, pos = next_piece(store, source)
    if chunk is None:
        return PollResult()
    now = utc_now()
    reader = EngineLogReader(source.location, now, state=pos.state or None)
    for line_no, raw in chunk.lines():
        reader.feed(line_no, raw.decode("utf-8", "replace"))
    windows, faults = reader.take()
    if faults and not source.skip_bad:
        raise SourceStopped(f"{faults[0]} (the source stops here; fix the log or watch it with skip_bad)")
    for fault in faults:
        log(f"skipped {fault}")
    new_pos = position_after(chunk, pos, reader.state())
    delivery = Delivery(chunk.dedupe_key(source.key), Path(source.location).name, "engine-log", source.run_name,
                        "engine", now, baseline_of=source.baseline_of)

    def write(cur, run_id: int, ingest_id: int) -> Counts:
        by_template: dict[str, list] = {}
        for w in windows:
            template = source.template or annotated_template(cur, source.run_name, w.end_ts or now) or ""
            by_template.setdefault(template, []).append(w)
        stored = sum(store_windows(cur, group, ingest_id, get_or_create_segment(cur, run_id, template), now)
                     for template, group in by_template.items())
        return Counts(rows_read=len(windows), steps=stored)

    stored = store_read(store, delivery, write, in_transaction=lambda cur, c: save_position(cur, source, new_pos,
                                                                                           c.steps, now))
    if stored is None:  # this piece was stored before the watcher stopped: move on past it
        with store.transaction() as cur:
            save_position(cur, source, new_pos, 0, now)
    return PollResult(len(windows), faults, more=chunk.backlog)


def poll_steplog(store: Store, source: SourceConfig, log: Log) -> PollResult:
    """Ingest the step log's new complete lines (the ingest's rules and messages), committed with the position."""
    chunk, pos = next_piece(store, source)
    if chunk is None:
        return PollResult()
    now = utc_now()
    new_pos = position_after(chunk, pos, {})
    with store.cursor() as cur:
        template = source.template or annotated_template(cur, source.run_name, now)
    # The piece goes through the ingest as a spool (the step-log reader reads a file), named after this process:
    # one left by a watcher killed outright is swept by the next spool of any specmon process.
    with spooled(io.BytesIO(chunk.data)) as piece:
        result = ingest_file(
            store, piece, name=source.location, run=source.run_name, template=template, fmt="steplog-jsonl",
            skip_bad=source.skip_bad, report_path=f"{source.location}.rejected.jsonl",
            dedupe_key=chunk.dedupe_key(source.key),
            first_line=chunk.first_line, baseline_of=source.baseline_of,
            in_transaction=lambda cur, r: save_position(cur, source, new_pos, r.steps, now))
    if result.status == "rejected":
        raise SourceStopped(f"{result.faults[0]} ({result.fault_count} fault(s) in lines {chunk.first_line}-"
                            f"{new_pos.line_no}; the source stops here; fix the log or watch it with skip_bad)")
    if result.rejected:
        log(f"{source.location}: {result.rejected} bad line(s) skipped, see {result.report_path}")
    return PollResult(result.steps, result.faults, more=chunk.backlog)


# Where an inbox puts what it took: these names are its own, never ingested. Where a file already holds one of
# them (a marker someone left), the folder after it is used instead, and the log says so.
_INBOX_FOLDERS = {"done": ("done", "specmon-done"), "rejected": ("rejected", "specmon-rejected")}
_OWN_NAMES = {name for names in _INBOX_FOLDERS.values() for name in names}


def inbox_folder(inbox: Path, role: str, log: Log) -> Path:
    """The folder of the inbox for finished (role "done") or rejected files: done/ or rejected/, unless that name
    is taken by something that is not a folder; then specmon-done/ or specmon-rejected/."""
    first, second = (inbox / name for name in _INBOX_FOLDERS[role])
    if first.is_dir() or not os.path.lexists(first):
        return first
    if second.is_dir() or not os.path.lexists(second):
        if not second.is_dir():
            log(f"{first} is a file, not a folder: {role} files go to {second} (remove or rename {first} to have "
                f"them in {first.name}/)")
        return second
    raise SpecmonError(f"{inbox}: {first.name} and {second.name} are both files, not folders: remove or rename one "
                       f"so that {role} files have somewhere to go")


def free_name(name: str, *folders: Path) -> str:
    """A name that none of the folders holds yet, with or without a report beside it: name, else name-1, name-2,
    ... before the extension (steps.jsonl, steps-1.jsonl), so that a delivery never replaces an earlier one."""
    stem, dot, ext = name.partition(".") if not name.startswith(".") else (name, "", "")
    n = 0
    while True:
        candidate = name if n == 0 else f"{stem}-{n}{dot}{ext}"
        taken = [f"{candidate}{suffix}" for suffix in ("", ".report.json", ".rejected.jsonl")]
        if not any(os.path.lexists(folder / t) for folder in folders for t in taken):
            return candidate
        n += 1


# An inbox file being taken is held under this prefix (a second name for the same file, hidden from the polls), so
# that what is stored and what is moved to done/ or rejected/ are the same file whatever the inbox name holds by then.
_HOLD_PREFIX = ".specmon-taking-"
_LEAVING_PREFIX = ".specmon-leaving-"  # an inbox name being let go of (_let_go)


def poll_inbox(store: Store, source: SourceConfig, log: Log, seen: dict[str, tuple[int, int]]) -> PollResult:
    """Ingest every complete file in the folder once, then move it to done/ or rejected/ with its report.

    A file is complete when its size and modification time did not change between two polls (seen holds the
    last look) and it does not end in a partial-download suffix. It is taken through a second name of its own
    (_hold): what is read, stored and moved to done/ is that file, and the inbox name is let go only while it still
    names it, so a new delivery moved in under the same name meanwhile stays in the inbox for the next poll.
    Ingest is deduplicated by content, so a watcher killed between storing a file and moving it stores nothing
    twice when it sees the file again (a held name it left behind is put back first). A file delivered under a
    name done/ or rejected/ already holds is kept beside the earlier one (free_name). A file written to while it is
    read is left where it is and taken once it is stable again: only content that fails to parse goes to
    rejected/."""
    folder = Path(source.location)
    if not folder.is_dir():
        raise SpecmonError(f"{folder}: no such folder")
    _put_back_held(folder, log)
    stored = 0
    faults: list[Fault] = []
    for entry in sorted(folder.iterdir()):
        if (not entry.is_file() or entry.name.startswith(".") or entry.name.endswith(_PARTIAL_SUFFIXES)
                or entry.name in _OWN_NAMES):
            continue
        st = entry.stat()
        look = (st.st_size, st.st_mtime_ns)
        if seen.get(str(entry)) != look:
            seen[str(entry)] = look  # seen once: take it at the next poll if it did not change
            continue
        del seen[str(entry)]
        held = _hold(entry, st)
        done_dir, rejected_dir = inbox_folder(folder, "done", log), inbox_folder(folder, "rejected", log)
        rejected_dir.mkdir(exist_ok=True)
        done_dir.mkdir(exist_ok=True)
        name = free_name(entry.name, done_dir, rejected_dir)
        report = rejected_dir / f"{name}.rejected.jsonl"
        with store.cursor() as cur:
            template = source.template or annotated_template(cur, source.run or entry.stem, utc_now())
        result = ingest_file(store, str(held or entry), name=str(entry), run=source.run, template=template,
                             skip_bad=source.skip_bad, report_path=str(report), baseline_of=source.baseline_of)
        if result.changed_while_read:  # not bad content: whatever the file holds now is read at a later poll
            report.unlink(missing_ok=True)
            if held is not None:
                held.unlink(missing_ok=True)
            log(f"{entry}: changed while it was read; left in the inbox to be read again")
            continue
        target = rejected_dir if result.status == "rejected" else done_dir
        (target / f"{name}.report.json").write_bytes(orjson.dumps(result.as_dict(), option=orjson.OPT_INDENT_2))
        if held is None:
            os.replace(entry, target / name)
        else:
            os.replace(held, target / name)
            _let_go(entry, (st.st_dev, st.st_ino), log)
        if result.status == "rejected":
            faults += result.faults
            log(f"{entry}: rejected ({result.fault_count} fault(s), first: {result.faults[0]}); moved to "
                f"{target / name}")
        else:
            stored += result.steps
            log(f"{entry}: {result.status} ({result.steps} rows); moved to {target / name}")
    now = utc_now()
    with store.transaction() as cur:
        save_position(cur, source, Position(), stored, now)
    return PollResult(stored, faults)


def _hold(entry: Path, st: os.stat_result) -> Path | None:
    """A second name for the inbox file, in the inbox under _HOLD_PREFIX, naming the very file that was judged
    complete; None where the file system makes none (another file system behind a link, no hard links), and the
    file is then read and moved by its inbox name."""
    held = entry.with_name(_HOLD_PREFIX + entry.name)
    try:
        held.unlink(missing_ok=True)
        os.link(entry, held)
        same = held.stat()
    except OSError:
        return None
    if (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino):  # replaced between the look and the link
        held.unlink()
        return None
    return held


def _let_go(entry: Path, file_id: tuple[int, int], log: Log) -> None:
    """Remove the inbox name of a file taken, if it still names that file; a delivery moved in under the name
    since then is put back under it (or beside it, were yet another there by then) for the next poll."""
    gone = entry.with_name(_LEAVING_PREFIX + entry.name)
    try:
        os.rename(entry, gone)  # atomic: whatever the name held at this instant, and nothing after
    except FileNotFoundError:
        return
    now = gone.stat()
    if (now.st_dev, now.st_ino) == file_id:
        gone.unlink()
        return
    try:
        os.link(gone, entry)
        gone.unlink()
    except FileExistsError:
        os.rename(gone, entry.with_name(free_name(entry.name, entry.parent)))
    log(f"{entry}: a new file arrived under this name while the earlier one was stored; it is read next")


def _put_back_held(folder: Path, log: Log) -> None:
    """Held names a watcher killed while taking a file left behind: dropped where the inbox name still names the
    same file, else put back under a free name, so that no delivery is lost (ingest is deduplicated by content)."""
    for held in [*folder.glob(f"{_HOLD_PREFIX}*"), *folder.glob(f"{_LEAVING_PREFIX}*")]:
        if not held.is_file():
            continue
        original = held.name.removeprefix(_HOLD_PREFIX).removeprefix(_LEAVING_PREFIX)
        entry = folder / original
        try:
            if entry.exists() and os.path.samefile(entry, held):
                held.unlink()
                continue
        except OSError:
            pass
        back = folder / free_name(original, folder)
        os.rename(held, back)
        log(f"{back}: a file left while it was being taken; put back to be read")


def poll_prometheus(store: Store, source: SourceConfig, log: Log) -> PollResult:
    """Pull the samples since the last pull (the first reaches lookback_s back), committed with the new start."""
    pos = load_position(store, source)
    end = utc_now()
    last = pos.state.get("last_ts")
    start = datetime.fromisoformat(last) if last else end - timedelta(seconds=source.lookback_s)
    samples = prometheus_api.pull(source.location, start, end, source.step_s)
    if not samples:
        mark(store, source, "ok", None, end)
        return PollResult()
    newest = max(s.ts for s in samples)
    new_pos = Position(state={"last_ts": newest.isoformat()})
    result: IngestResult = ingest_samples(
        store, samples, f"{source.location} {start:%Y-%m-%dT%H:%M:%S}..{end:%H:%M:%S}", source.run_name,
        source.template, in_transaction=lambda cur, r: save_position(cur, source, new_pos, r.steps, end),
        baseline_of=source.baseline_of)
    if result.status == "already ingested":
        mark(store, source, "ok", None, end)
        return PollResult()
    return PollResult(result.steps)
