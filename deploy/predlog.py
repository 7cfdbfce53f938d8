"""The prediction log and its feedback: one SQLite database per deployment, shared by every
replica (WAL mode), in the dataset's lake at ``<lake>/predictions/predictions.db``.

* ``predictions``: one row per served text (or a sampled share of requests): the
  prediction id (uuid4 hex, returned to the client), the time, the **masked** text (what
  the model saw after normalization and PII masking; never the raw text), the label,
  confidence, out-of-scope and abstain flags, the model version, the request's latency in
  the server (queue wait and model) and the variant/replica that answered.
* ``feedback``: the true label a client or operator sent for a prediction id (a label
  name of the model's label set, never free text), when, and by whom (a key
  fingerprint). One row per prediction: a later feedback replaces the earlier one.

Writes come from the model server's batch worker through ``Writer``: a thread that takes
whole micro-batches from a queue and inserts each drain in one transaction (WAL with
``synchronous=NORMAL``: no fsync per commit), so serving never waits on the disk.
``retain`` bounds the log by age and row count; the server runs it on a timer.

Readers (drift monitoring, reports) use ``open_log``, ``recent`` and ``feedback``:
standard library only, because the serving image has no pandas.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("intentops.predlog")

SCHEMA = """
CREATE TABLE IF NOT EXISTS predictions (
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    ts REAL NOT NULL,
    text TEXT,
    label TEXT,
    score REAL NOT NULL,
    oos INTEGER NOT NULL,
    abstain INTEGER NOT NULL,
    version TEXT NOT NULL,
    latency_ms REAL NOT NULL,
    variant TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS predictions_ts ON predictions (ts);
CREATE TABLE IF NOT EXISTS feedback (
    prediction_id TEXT PRIMARY KEY,
    ts REAL NOT NULL,
    label TEXT NOT NULL,
    predicted TEXT,
    version TEXT NOT NULL,
    correct INTEGER NOT NULL,
    actor TEXT NOT NULL
);
"""

COLUMNS = ("id", "ts", "text", "label", "score", "oos", "abstain", "version", "latency_ms", "variant")
FEEDBACK_COLUMNS = ("prediction_id", "ts", "label", "predicted", "version", "correct", "actor")


def connect(path: str | Path, create: bool = True) -> sqlite3.Connection:
    """A connection in WAL mode with a busy timeout (several replicas write the same file)."""
    path = Path(path)
    if create:
        path.parent.mkdir(parents=True, exist_ok=True)
    elif not path.exists():
        raise FileNotFoundError(f"no prediction log at {path}")
    con = sqlite3.connect(str(path), timeout=10, isolation_level=None, check_same_thread=False)
    con.execute("PRAGMA busy_timeout = 10000")
    if create:
        con.execute("PRAGMA journal_mode = WAL")
        with transaction(con):
            for stmt in SCHEMA.split(";"):
                if stmt.strip():
                    con.execute(stmt)
    con.execute("PRAGMA synchronous = NORMAL")
    return con


@contextlib.contextmanager
def transaction(con: sqlite3.Connection) -> Iterator[None]:
    con.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


# -- readers ----------------------------------------------------------------------------


def open_log(path: str | Path) -> sqlite3.Connection:
    """A connection to an existing log for reading (rows as ``sqlite3.Row``)."""
    con = connect(path, create=False)
    con.row_factory = sqlite3.Row
    return con


def recent(path: str | Path, since: float = 0.0, limit: int | None = None) -> list[dict[str, Any]]:
    """Predictions logged at or after ``since`` (Unix time), oldest first."""
    con = open_log(path)
    try:
        sql = f"SELECT {', '.join(COLUMNS)} FROM predictions WHERE ts >= ? ORDER BY ts, seq"
        args: tuple = (since,)
        if limit is not None:
            sql += " LIMIT ?"
            args += (int(limit),)
        return [_row(r) for r in con.execute(sql, args)]
    finally:
        con.close()


def feedback(path: str | Path, since: float = 0.0) -> list[dict[str, Any]]:
    """Feedback received at or after ``since``, joined with its prediction's masked text and
    confidence, oldest first."""
    con = open_log(path)
    try:
        rows = con.execute(
            f"SELECT {', '.join('f.' + c for c in FEEDBACK_COLUMNS)}, p.text, p.score, p.oos "
            "FROM feedback f JOIN predictions p ON p.id = f.prediction_id WHERE f.ts >= ? ORDER BY f.ts",
            (since,))
        return [_row(r) for r in rows]
    finally:
        con.close()


def _row(r: sqlite3.Row) -> dict[str, Any]:
    d = dict(r)
    for flag in ("oos", "abstain", "correct"):
        if flag in d:
            d[flag] = bool(d[flag])
    return d


def accuracy(con: sqlite3.Connection) -> dict[str, tuple[int, int]]:
    """Per model version: (feedback rows, correct ones), over the retained feedback."""
    return {v: (n, c or 0) for v, n, c in
            con.execute("SELECT version, COUNT(*), SUM(correct) FROM feedback GROUP BY version")}


# -- writing ------------------------------------------------------------------------------


def retain(con_or_path: sqlite3.Connection | str | Path, days: float, max_rows: int,
           now: float | None = None) -> int:
    """Delete predictions older than ``days`` and the oldest beyond ``max_rows``, and the
    feedback of deleted predictions; the number of predictions deleted."""
    con = connect(con_or_path) if not isinstance(con_or_path, sqlite3.Connection) else con_or_path
    try:
        cutoff = (time.time() if now is None else now) - days * 86400
        with transaction(con):
            n = con.execute("DELETE FROM predictions WHERE ts < ?", (cutoff,)).rowcount
            # The newest max_rows by sequence stay (ties of ts across replicas do not matter).
            edge = con.execute("SELECT seq FROM predictions ORDER BY seq DESC LIMIT 1 OFFSET ?",
                               (max(int(max_rows), 0),)).fetchone()
            if edge is not None:
                n += con.execute("DELETE FROM predictions WHERE seq <= ?", (edge[0],)).rowcount
            if n:
                con.execute("DELETE FROM feedback WHERE prediction_id NOT IN (SELECT id FROM predictions)")
        return n
    finally:
        if con is not con_or_path:
            con.close()


class Writer:
    """A thread that inserts queued micro-batches, one transaction per drain of the queue,
    at most one every ``group_s`` seconds.

    ``put`` never blocks the caller: when more than ``max_pending`` batches wait (the disk
    cannot keep up), the batch is dropped and counted in ``dropped`` rather than slowing
    serving down."""

    def __init__(self, path: str | Path, max_pending: int = 1000, group_s: float = 0.02) -> None:
        self.path = Path(path)
        self.group_s = group_s
        self.con = connect(self.path)
        self.queue: queue.Queue[list[tuple] | None] = queue.Queue()
        self.max_pending = max_pending
        self.dropped = 0
        self.written = 0
        self._idle = threading.Condition()
        self._pending = 0
        self.thread = threading.Thread(target=self._run, name="predlog-writer", daemon=True)
        self.thread.start()

    def put(self, rows: Sequence[tuple]) -> bool:
        with self._idle:
            if self._pending >= self.max_pending:
                self.dropped += len(rows)
                return False
            self._pending += 1
        self.queue.put(list(rows))
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything queued so far is committed."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def _run(self) -> None:
        last = 0.0
        while True:
            batches = [self.queue.get()]
            # Group commit: at most one transaction per ``group_s``; the batches that queue
            # meanwhile join it (a commit costs about 0.1 ms of CPU whatever its rows).
            wait = last + self.group_s - time.monotonic()
            if wait > 0 and batches[0] is not None:
                time.sleep(wait)
            with contextlib.suppress(queue.Empty):
                while len(batches) < 1024:
                    batches.append(self.queue.get_nowait())
            last = time.monotonic()
            stop = None in batches
            rows = [r for b in batches if b for r in b]
            try:
                if rows:
                    with transaction(self.con):
                        self.con.executemany(
                            f"INSERT OR IGNORE INTO predictions ({', '.join(COLUMNS)}) "
                            f"VALUES ({', '.join('?' * len(COLUMNS))})", rows)
                    self.written += len(rows)
            except sqlite3.Error:
                log.exception("prediction log: %d rows not written", len(rows))
                self.dropped += len(rows)
            with self._idle:
                self._pending -= sum(1 for b in batches if b is not None)
                self._idle.notify_all()
            if stop:
                return

    def close(self) -> None:
        self.queue.put(None)
        self.thread.join(timeout=10)
        self.con.close()


def lookup(con: sqlite3.Connection, prediction_id: str) -> tuple[str | None, str] | None:
    """(label, version) of a logged prediction; None when the log does not hold it."""
    row = con.execute("SELECT label, version FROM predictions WHERE id = ?", (prediction_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def record_feedback(con: sqlite3.Connection, prediction_id: str, label: str, predicted: str | None,
                    version: str, actor: str, now: float | None = None) -> bool:
    """Store the true label of a prediction (a later feedback replaces an earlier one);
    whether the prediction was right."""
    correct = predicted is not None and predicted == label
    with transaction(con):
        con.execute(
            "INSERT INTO feedback (prediction_id, ts, label, predicted, version, correct, actor) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (prediction_id) DO UPDATE SET "
            "ts = excluded.ts, label = excluded.label, correct = excluded.correct, actor = excluded.actor",
            (prediction_id, time.time() if now is None else now, label, predicted, version, int(correct), actor))
    return correct
