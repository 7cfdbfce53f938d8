"""The ``intentops`` command: run any stage by hand.

    intentops build-raw --out var/demo/raw --rows 20000      # synthetic raw export
    intentops clean --set input.path=var/demo/raw/raw.csv --run-id manual-1
    intentops dedup --run-id manual-1
    intentops desensitize --run-id manual-1                   # PII masking
    intentops validate --run-id manual-1                      # Great Expectations gate
    intentops run --set input.path=exports/tickets.jsonl     # all data stages, no Airflow
    intentops summary [--run-id RUN]                          # per-stage summary
    intentops evaluate --run-id RUN --ground-truth DIR        # score against ground truth
    intentops leak-scan --ground-truth DIR var/lake/desensitize ...   # find planted PII
    intentops leak-scan --detect var/lake/desensitize ...     # what the detector still finds
    intentops pii detect [--mask] < sample.txt                # PII spans (JSON) per line
    intentops up | down | services                            # the local services (make up/down)

Stages run in-process on a local Spark session (``spark.master``); the DAG runs the same
code through spark-submit. Every stage command takes ``--config FILE`` and repeatable
``--set section.field=value`` overrides.
"""

from __future__ import annotations

import argparse
import bisect
import logging
import sys
import time
import unicodedata
from collections.abc import Callable

from core.stage import StageError


def _stage_parser(sub, name: str, help_: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_)
    p.add_argument("--config", help="YAML config file (default configs/pipeline.yaml)")
    p.add_argument("--resolved-config", help="a run's resolved config.json")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field (repeatable)",
    )
    p.add_argument("--run-id", help="pipeline run id (default: manual-<timestamp>)")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="intentops", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build-raw", help="build the synthetic raw export (see --help)", add_help=False)
    _stage_parser(sub, "clean", "clean stage")
    _stage_parser(sub, "dedup", "dedup stage (needs the run's clean output)")
    _stage_parser(sub, "desensitize", "PII masking (needs the run's dedup output)")
    _stage_parser(sub, "validate", "data-validation gate (needs the run's desensitize output)")
    _stage_parser(sub, "labelqa", "label QA and curated split (needs the run's validate output)")
    _stage_parser(sub, "export", "ONNX fp32 + int8 builds of the run's registered model version")
    _stage_parser(sub, "run", "every data stage in order, without Airflow")
    dp = sub.add_parser("deploy", help="the serving deployment: status, rollout, rollback, stop")
    dsub = dp.add_subparsers(dest="action", required=True)
    for action, help_ in (("status", "versions, weights and health of the router and servers"),
                          ("up", "start the router and the champion's server if they are not running"),
                          ("rollback", "serve the 'previous' version now and swap champion/previous"),
                          ("stop", "stop every process the deployment started")):
        _stage_parser(dsub, action, help_)
    ro = _stage_parser(dsub, "rollout", "canary rollout of the run's exported version (the DAG's deploy task)")
    ro.set_defaults(cmd="deploy-rollout")
    for name, help_ in (("up", "start the local services: MLflow server, airflow standalone, serving"),
                        ("down", "stop what `up` started (and the serving processes)"),
                        ("services", "URLs, credentials file and state of the local services")):
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("--config", help="YAML config file")
    e = sub.add_parser("evaluate", help="score a run's data stages against builder ground truth")
    e.add_argument("--run-id", required=True)
    e.add_argument("--ground-truth", required=True, help="the builder's ground_truth/ folder")
    e.add_argument("--config", help="YAML config file")
    ls = sub.add_parser("leak-scan", help="search folders for planted or detectable personal data")
    how = ls.add_mutually_exclusive_group(required=True)
    how.add_argument("--ground-truth", help="the builder's ground_truth/ folder (known values)")
    how.add_argument("--detect", action="store_true",
                     help="no known values: count what the PII detector still finds")
    ls.add_argument("paths", nargs="+", help="folders or files to scan")
    pii_p = sub.add_parser("pii", help="PII detection on text you give it (see `pii detect --help`)")
    pii_sub = pii_p.add_subparsers(dest="action", required=True)
    pd_ = pii_sub.add_parser(
        "detect",
        help="print the PII spans found in each line of stdin",
        description=_PII_DETECT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    pd_.add_argument(
        "--mask", action="store_true", help="print each line masked (<CARD>, <EMAIL>, ...) instead"
    )
    pd_.set_defaults(cmd="pii-detect")
    s = sub.add_parser("summary", help="print a run's per-stage summary")
    s.add_argument("--run-id", help="default: the latest finished run")
    s.add_argument("--config", help="YAML config file")

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build-raw"]:
        from demo import builder as rawdata

        rawdata.main(argv[1:])
        return 0
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return _dispatch(args)
    except StageError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if type(exc).__name__ in ("ExportError", "BuildError"):
            print(f"ERROR: {exc}", file=sys.stderr)
            return 2
        if type(exc).__name__ not in ("GateFailed", "QAGateFailed"):
            raise
        print(f"GATE FAILED: {exc}", file=sys.stderr)
        return 3


_PII_DETECT_HELP = """\
Find personal data in text, one text per line: run it on a sample of your own export
before the pipeline to see what would be masked.

Reads UTF-8 text on stdin, one text per line (lines end at "\\n" only), and writes one
JSON object per input line, in order:

    {"spans": [{"type": "CARD", "start": 11, "end": 30, "source": "card-pattern+luhn"}]}

type is one of PERSON, ADDRESS, EMAIL, PHONE, CARD, IBAN, US_SSN, PRC_ID, IP_ADDRESS;
start/end are code-point offsets into that input line (end exclusive); source is the rule
or model that found the span. The values themselves are never printed. A line that is
not valid UTF-8 gives {"spans": [], "error": "invalid UTF-8 at byte N"}.

With --mask, each line is printed with its spans replaced (<CARD>, <EMAIL>, ...), in the
NFKC-normalized form the pipeline masks.

    intentops pii detect < sample.txt
    head -n 1000 export.txt | intentops pii detect --mask
"""


def nfkc_map(text: str) -> tuple[str, Callable[[int, int], tuple[int, int]]]:
    """``text`` NFKC-normalized, and a function from a span ``(start, end)`` of the
    normalized text to the span of ``text`` it came from (code points, end exclusive).

    ``text`` is cut into pieces that normalize on their own: a character, or a character
    with what normalization joins to it (combining marks, Hangul jamo, ...). A span's start
    goes to the start of the piece whose output holds it, its end to the end of the piece
    whose output holds ``end - 1``. So "ﬁ" (one character, "fi" normalized) maps back
    whole, and a full-width digit to itself.
    """
    norm = unicodedata.normalize("NFKC", text)
    pieces: list[tuple[int, tuple[int, int]]] = []  # (where its output starts, (start, end))
    for fine in (True, False):
        pieces, outs, pos = [], [], 0
        for s, e in _nfkc_pieces(text, fine):
            outs.append(unicodedata.normalize("NFKC", text[s:e]))
            pieces.append((pos, (s, e)))
            pos += len(outs[-1])
        if "".join(outs) == norm:  # the cut is exact (always so with fine=False)
            break
    else:  # not reached
        pieces = []
    if not pieces:  # empty text (or no exact cut): one piece
        pieces = [(0, (0, len(text)))]
    keys = [k for k, _ in pieces]

    def to_original(start: int, end: int) -> tuple[int, int]:
        first = pieces[max(bisect.bisect_right(keys, start) - 1, 0)][1]
        last = pieces[max(bisect.bisect_right(keys, max(end - 1, start)) - 1, 0)][1]
        return first[0], last[1]

    return norm, to_original


def _nfkc_pieces(text: str, fine: bool) -> list[tuple[int, int]]:
    """Cut ``text`` into pieces that should normalize independently (see ``nfkc_map``).

    ``fine``: a cut before every starter that normalization does not join to the piece
    before it (checked on at most the piece's last 32 characters; ``nfkc_map`` checks the
    whole). Otherwise cut only before ASCII characters: nothing composes with a following
    ASCII character and nothing is reordered across one, so those cuts are always exact.
    """
    if not text:
        return []
    bounds = [0]
    start = 0
    for i in range(1, len(text)):
        c = text[i]
        if c < "\x80":
            bounds.append(i)
            start = i
        # A combining mark (or a character that decomposes into them) stays with its base.
        elif fine and not unicodedata.combining(unicodedata.normalize("NFKD", c)[0]):
            seg = text[max(start, i - 32) : i]
            if unicodedata.normalize("NFKC", seg + c) == unicodedata.normalize(
                "NFKC", seg
            ) + unicodedata.normalize("NFKC", c):
                bounds.append(i)
                start = i
    bounds.append(len(text))
    return list(zip(bounds, bounds[1:], strict=False))


def pii_spans(line: str) -> list[dict]:
    """The PII spans of one line, offsets into ``line``; never the values themselves."""
    from pii import detector as pii

    if unicodedata.is_normalized("NFKC", line):
        norm, to_original = line, None
    else:
        norm, to_original = nfkc_map(line)
    spans = []
    for d in pii.detect(norm):
        start, end = to_original(d.start, d.end) if to_original else (d.start, d.end)
        spans.append({"type": d.entity, "start": start, "end": end, "source": d.source})
    spans.sort(key=lambda sp: (sp["start"], sp["end"]))
    return spans


def _pii_detect(stdin, stdout, stderr, mask: bool = False) -> int:
    """``intentops pii detect``: stdin bytes in, one JSON object (or masked line) per line."""
    import json

    from pii import detector as pii

    try:
        for n, raw in enumerate(stdin, 1):
            chunk = raw[:-1] if raw.endswith(b"\n") else raw
            if chunk.endswith(b"\r"):
                chunk = chunk[:-1]
            try:
                line = chunk.decode("utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                if mask:
                    stdout.write(b"\n")
                    print(f"line {n}: invalid UTF-8", file=stderr)
                else:
                    obj = {"spans": [], "error": f"invalid UTF-8 at byte {exc.start}"}
                    stdout.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
                continue
            try:
                if mask:
                    out = pii.mask(line)[0]
                else:
                    out = json.dumps({"spans": pii_spans(line)}, ensure_ascii=False)
            except Exception as exc:  # one bad line must not stop the rest
                name = type(exc).__name__
                if mask:
                    out = ""
                    print(f"line {n}: {name}", file=stderr)
                else:
                    out = json.dumps({"spans": [], "error": name}, ensure_ascii=False)
            stdout.write(out.encode("utf-8", errors="surrogatepass") + b"\n")
        stdout.flush()
    except BrokenPipeError:  # e.g. `| head`: the reader is gone, which is not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _deploy(args: argparse.Namespace) -> int:
    import json

    from deploy.deployment import DeployError, Deployment
    from jobs.spark import common

    cfg = common.config_from_args(args)
    dep = Deployment(cfg)
    try:
        if args.action == "status":
            print(json.dumps(dep.status(), indent=2))
        elif args.action == "up":
            from deploy import task as dt

            stable = dt.ensure_serving(cfg)
            print(json.dumps({"router": dt.router_url(cfg), "stable": stable and stable["version"],
                              "client_keys_file": str(dep.client_keys_file)}, indent=2))
        elif args.action == "rollback":
            print(json.dumps(dep.rollback(), indent=2))
        elif args.action == "stop":
            stopped = dep.stop()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    except DeployError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.cmd == "pii-detect":
        return _pii_detect(sys.stdin.buffer, sys.stdout.buffer, sys.stderr, mask=args.mask)

    from core import runs

    if args.cmd in ("up", "down", "services"):
        import json

        from core.config import load_config
        from ops.services import ServiceError, Services

        svc = Services(load_config(args.config))
        try:
            if args.cmd == "up":
                print(json.dumps(svc.up(), indent=2))
            elif args.cmd == "down":
                stopped = svc.down()
                print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
            else:
                print(json.dumps(svc.describe(), indent=2))
        except ServiceError as exc:
            print(f"ERROR: {exc}", file=sys.stderr)
            return 2
        return 0
    if args.cmd == "deploy" and args.action != "rollout":
        return _deploy(args)
    if args.cmd == "deploy-rollout":
        from deploy import task as deploy_task
        from jobs.spark import common

        cfg = common.config_from_args(args)
        print(deploy_task.deploy(cfg, run_id=args.run_id).to_json())
        return 0

    if args.cmd == "summary":
        from core.config import load_config

        cfg = load_config(args.config)
        if args.run_id:
            print(runs.render(runs.collect(cfg.lake, args.run_id), args.run_id))
        else:
            print(runs.latest_summary(cfg.lake), end="")
        return 0

    if args.cmd == "leak-scan":
        import json

        from ops import leakscan

        if args.detect:
            hits = leakscan.detect_scan(args.paths)
        else:
            hits = leakscan.scan(args.paths, leakscan.load_needles(args.ground_truth))
        print(json.dumps({"hits": hits, "count": len(hits)}, indent=2))
        return 1 if hits else 0

    if args.cmd == "evaluate":
        import json

        from core.config import load_config
        from core.stage import upstream
        from demo.groundtruth import evaluate

        cfg = load_config(args.config)
        c, d = (upstream(cfg.lake, args.run_id, s) for s in ("clean", "dedup"))
        threshold = d.manifest["config"]["dedup"]["threshold"]
        print(json.dumps(evaluate(args.ground_truth, c.path, d.path, threshold), indent=2))
        return 0

    from jobs.spark import clean, common, dedup, desensitize
    from quality import gate

    cfg = common.config_from_args(args)
    run_id = args.run_id or time.strftime("manual-%Y%m%dT%H%M%S")
    if args.cmd == "export":
        from export import task as export_task

        print(export_task.export(cfg, run_id=run_id).to_json())
        return 0
    if args.cmd in ("clean", "run"):
        print(clean.run(cfg, run_id=run_id).to_json())
    if args.cmd in ("dedup", "run"):
        print(dedup.run(cfg, run_id=run_id).to_json())
    if args.cmd in ("desensitize", "run"):
        print(desensitize.run(cfg, run_id=run_id).to_json())
    if args.cmd in ("validate", "run"):
        result = gate.run(cfg, run_id=run_id)
        print(result.to_json())
        gate.check(result)
    if args.cmd in ("labelqa", "run"):
        from quality import labelqa

        result = labelqa.run(cfg, run_id=run_id)
        print(result.to_json())
        labelqa.check(result)
    if args.cmd == "run":
        runs.write_summary(runs.save_run_config(cfg, run_id), run_id)
        print(runs.latest_summary(cfg.lake), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
