"""The ``intentops`` command: run any stage by hand.

    intentops build-raw --out var/demo/raw --rows 20000      # synthetic raw export
    intentops stages [--json]                                 # the stage registry, code versions
    intentops clean --set input.path=var/demo/raw/raw.csv --run-id manual-1
    intentops dedup --run-id manual-1                         # every stage is a command
    intentops run --set input.path=exports/tickets.jsonl     # stages in order, no Airflow
    intentops run --through train --run-id manual-1          # ... up to any stage
    intentops summary [--run-id RUN]                          # per-stage summary
    intentops monitor check [--end UNIX_TIME]                 # one drift check of served traffic
    intentops evaluate --run-id RUN --ground-truth DIR        # score against ground truth
    intentops leak-scan --ground-truth DIR var/lake/desensitize ...   # find planted PII
    intentops leak-scan --detect var/lake/desensitize ...     # what the detector still finds
    intentops pii detect [--mask] < sample.txt                # PII spans (JSON) per line
    intentops up | down | services                            # the local services (make up/down)

The stage commands come from the stage registry (``core/stages.py``). Spark stages run
in-process on a local Spark session (``spark.master``); the DAG runs the same code through
spark-submit. Every stage command takes ``--config FILE`` and repeatable
``--set section.field=value`` overrides. Exit status: 0 done, 2 a problem to fix (bad
input, bad settings, missing upstream output), 3 a stage's verdict stopped the run (a
failed gate, a failed parity check, a rollback).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
import time
from collections.abc import Callable

from core import stages
from core.stage import StageError, StageSkipped, StageVerdict


def _with_config(p: argparse.ArgumentParser, run_id: bool = True) -> argparse.ArgumentParser:
    p.add_argument("--config", help="YAML config file (default configs/pipeline.yaml)")
    p.add_argument("--resolved-config", help="a run's resolved config.json")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field (repeatable)")
    if run_id:
        p.add_argument("--run-id", help="pipeline run id (default: manual-<timestamp>)")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="intentops", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build-raw", help="build the synthetic raw export (see --help)", add_help=False)
    st = sub.add_parser("stages", help="the stages in order: upstream, config sections, code version")
    st.add_argument("--json", action="store_true", help="a JSON list of objects")
    for s in stages.STAGES:
        if s.name != "deploy":  # `deploy rollout`, beside the deployment's other actions
            _with_config(sub.add_parser(s.name, help=s.summary)).set_defaults(stage=s.name)
    r = _with_config(sub.add_parser("run", help="the stages in order, in-process, without Airflow"))
    r.add_argument("--through", choices=stages.NAMES, default="labelqa",
                   help="the last stage to run (default labelqa: every data stage)")
    dp = sub.add_parser("deploy", help="the serving deployment: status, rollout, rollback, keys, stop")
    dsub = dp.add_subparsers(dest="action", required=True)
    for action, help_ in (("status", "versions, weights and health of the router and servers"),
                          ("up", "start the router and the champion's server if they are not running"),
                          ("rollback", "serve the 'previous' version now and swap champion/previous"),
                          ("stop", "stop every process the deployment started")):
        _with_config(dsub.add_parser(action, help=help_))
    sp = _with_config(dsub.add_parser("scale", help="run N stable replicas now (the autoscaler, when on, "
                                      "moves it again within its bounds)"))
    sp.add_argument("replicas", type=int)
    kp = _with_config(dsub.add_parser("keys", help="the router's client keys, as the admin role: "
                                      "list, create (shown once), revoke FINGERPRINT"))
    kp.add_argument("keys_action", choices=("list", "create", "revoke"))
    kp.add_argument("fingerprint", nargs="?", help="the key to revoke (from `keys list`)")
    ro = _with_config(dsub.add_parser("rollout", help=stages.get("deploy").summary))
    ro.set_defaults(cmd="deploy", stage="deploy")
    rp = _with_config(sub.add_parser("review-pull", help="merge finished Label Studio annotations into "
                                     "the lake's reviewer source (what the DAG's review_pull sensor does)"),
                      run_id=False)
    rp.set_defaults(cmd="review-pull")
    for name, help_ in (("up", "start the local services: MLflow server, airflow standalone, serving"),
                        ("down", "stop what `up` started (and the serving processes)"),
                        ("services", "URLs, credentials file and state of the local services (or of "
                         "the cluster shape, when it is up)"),
                        ("cluster-up", "start the scaled-out shape as local processes: Postgres, Redis, "
                         "a Spark master and two workers, MLflow on Postgres, Airflow with two Celery workers"),
                        ("cluster-down", "stop everything cluster-up started")):
        sub.add_parser(name, help=help_).add_argument("--config", help="YAML config file")
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
    from pii.lines import DETECT_HELP

    pd_ = pii_sub.add_parser("detect", help="print the PII spans found in each line of stdin",
                             description=DETECT_HELP,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
    pd_.add_argument("--mask", action="store_true",
                     help="print each line masked (<CARD>, <EMAIL>, ...) instead")
    au = sub.add_parser("audit", help="the audit log: who changed what is served, when and why")
    au.add_argument("--action", help="only this action (alias.move, registration, rollout, rollback, "
                    "server.reload, router.routes, dag.trigger)")
    au.add_argument("--since", help="from this UTC time on (2026-12-05 or 2026-12-05T14:00:00Z)")
    au.add_argument("--until", help="up to this UTC time")
    au.add_argument("--json", action="store_true", help="JSON lines, as stored")
    mo = sub.add_parser("monitor", help="drift monitoring: one check of the served traffic")
    msub = mo.add_subparsers(dest="monitor_action", required=True)
    mc = _with_config(msub.add_parser("check", help="the monitoring DAG's check, by hand: the window "
                                      "ending at --end (default now) against the champion's training data"),
                      run_id=False)
    mc.add_argument("--end", type=float, help="the window's end, Unix time (default: now)")
    mc.add_argument("--check-id", help="the check's folder under <lake>/monitoring/ (default: check_<end>)")
    sa = _with_config(sub.add_parser(
        "spark-archive", help="build the class-data-sharing archive of the Spark JVM's classes "
        "that spark.class_archive names (once per machine; rebuild after a JVM or Spark upgrade)"),
        run_id=False)
    sa.add_argument("--out", help="where to write it (default: spark.class_archive)")
    s = sub.add_parser("summary", help="print a run's per-stage summary")
    s.add_argument("--run-id", help="default: the latest finished run")
    s.add_argument("--config", help="YAML config file")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["build-raw"]:
        from demo import builder

        builder.main(argv[1:])
        return 0
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ops.services import apply_client_credentials

    apply_client_credentials()
    try:
        return _handler(args)(args)
    except StageVerdict as exc:  # before StageError: a verdict is one
        print(f"STOPPED: {exc}", file=sys.stderr)
        return 3
    except StageError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2


def _audit(args: argparse.Namespace) -> int:
    import json

    from core import audit

    if args.action and args.action not in audit.ACTIONS:
        print(f"ERROR: unknown action {args.action!r}; known: {', '.join(sorted(audit.ACTIONS))}",
              file=sys.stderr)
        return 2
    n = 0
    for rec in audit.read(action=args.action, since=args.since, until=args.until):
        n += 1
        if args.json:
            print(json.dumps(rec))
        else:
            print(f"{rec['at']}  {rec['action']:<14} {rec['outcome']:<16} {rec['target']}  by {rec['actor']}"
                  + (f" ({rec['role']})" if rec.get("role") else "") + (f": {rec['reason']}" if rec["reason"] else ""))
    if not args.json:
        print(f"{n} record(s) in {audit.path()}", file=sys.stderr)
    return 0


def _handler(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    if getattr(args, "stage", None):
        return _stage
    if args.cmd == "deploy":
        return _deploy
    if args.cmd == "pii":
        return _pii
    return {"audit": _audit, "stages": _stages, "run": _run, "up": _services, "down": _services,
            "cluster-up": _services, "cluster-down": _services,
            "services": _services, "summary": _summary, "leak-scan": _leak_scan,
            "evaluate": _evaluate, "review-pull": _review_pull, "monitor": _monitor,
            "spark-archive": _spark_archive}[args.cmd]


def _spark_archive(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jobs.spark.class_archive import ArchiveError, build

    cfg = _config(args)
    out = Path(args.out) if args.out else cfg.spark.archive_path()
    if out is None:
        print("ERROR: no archive path: pass --out or set spark.class_archive", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        path = build(out, cfg.spark.java_options)
    except ArchiveError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({path.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t0:.0f}s; "
          "spark.class_archive uses it when it names this file")
    return 0


def _review_pull(args: argparse.Namespace) -> int:
    import json

    from quality import review_stage

    try:
        print(json.dumps(review_stage.pull(_config(args)), indent=2))
    except StageSkipped as exc:
        print(f"SKIPPED: {exc}", file=sys.stderr)
    return 0


def _monitor(args: argparse.Namespace) -> int:
    """Prints the check's result (JSON); exit 0 whatever the verdict (drift is a finding)."""
    import json

    from ops import monitor

    result = monitor.check(_config(args), end=args.end, check_id=args.check_id)
    print(json.dumps(result, indent=2, default=str))
    return 0


def _run_one(name: str, cfg, run_id: str) -> None:
    """One stage: its work, its published result, then its verdict (StageVerdict stops)."""
    st = stages.get(name)
    try:
        result = st.run(cfg, run_id)
    except StageSkipped as exc:  # said, not silent; the run goes on
        print(f"SKIPPED {name}: {exc}", file=sys.stderr)
        return
    print(result.to_json())
    print(st.verdict(cfg, result), file=sys.stderr)


def _config(args: argparse.Namespace):
    from core.runs import config_from_args

    return config_from_args(args)


def _run_id(args: argparse.Namespace) -> str:
    return args.run_id or time.strftime("manual-%Y%m%dT%H%M%S")


def _stage(args: argparse.Namespace) -> int:
    _run_one(args.stage, _config(args), _run_id(args))
    return 0


def _run(args: argparse.Namespace) -> int:
    from core import runs

    cfg, run_id = _config(args), _run_id(args)
    order = stages.through(args.through)
    failed: list[str] = []
    try:
        for i, s in enumerate(order):
            try:
                _run_one(s.name, cfg, run_id)
            except StageVerdict:
                raise
            except StageError as exc:
                # A side branch no later stage reads (the review push with Label Studio
                # down) fails alone, as in the DAG: the run goes on, the exit status says so.
                if any(s.name in stages.ancestors(t.name) for t in order[i + 1:]):
                    raise
                print(f"ERROR in {s.name} (no later stage needs it; going on): {exc}", file=sys.stderr)
                failed.append(s.name)
    finally:  # the summary says where a stopped run stopped (when any stage published)
        with contextlib.suppress(StageError):
            runs.write_summary(runs.save_run_config(cfg, run_id), run_id)
            print(runs.latest_summary(cfg.lake), end="")
    return 2 if failed else 0


def _stages(args: argparse.Namespace) -> int:
    import json

    listed = [s.describe() for s in stages.STAGES]
    if args.json:
        print(json.dumps(listed, indent=2))
        return 0
    for s in listed:
        print(f"{s['name']:<12} {s['code_version']}  {s['kind']:<6} upstream: "
              f"{', '.join(s['upstream']) or '-'}; config: {', '.join(s['sections'])}; {s['work']}")
    return 0


def _deploy(args: argparse.Namespace) -> int:
    import json

    from deploy.deployment import DeployError, Deployment

    cfg = _config(args)
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
        elif args.action == "scale":
            print(json.dumps(dep.scale(args.replicas, "by hand (intentops deploy scale)"), indent=2))
        elif args.action == "keys":
            print(json.dumps(dep.keys(args.keys_action, args.fingerprint), indent=2))
        elif args.action == "stop":
            stopped = dep.stop()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    except DeployError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


def _pii(args: argparse.Namespace) -> int:
    from pii.lines import detect_lines

    return detect_lines(sys.stdin.buffer, sys.stdout.buffer, sys.stderr, mask=args.mask)


def _services(args: argparse.Namespace) -> int:
    import json

    from core.config import load_config
    from ops.cluster import Cluster, cluster_root
    from ops.services import ServiceError, Services

    cluster = args.cmd.startswith("cluster-") or (
        args.cmd == "services" and (cluster_root() / "state.json").exists()
        and any(k in json.loads((cluster_root() / "state.json").read_text()) for k in ("api_server", "postgres")))
    try:
        svc = Cluster() if cluster else Services(load_config(args.config))
        if args.cmd in ("up", "cluster-up"):
            print(json.dumps(svc.up(), indent=2))
        elif args.cmd in ("down", "cluster-down"):
            stopped = svc.down()
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        else:
            print(json.dumps(svc.describe(), indent=2))
    except ServiceError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        return 2
    return 0


def _summary(args: argparse.Namespace) -> int:
    from core import runs
    from core.config import load_config

    cfg = load_config(args.config)
    if args.run_id:
        saved = runs.run_dir(cfg.lake, args.run_id) / "config.json"  # the run's own price table
        priced = runs.load_run_config(saved) if saved.is_file() else cfg
        print(runs.render(runs.collect(cfg.lake, args.run_id), args.run_id, priced.cost))
    else:
        print(runs.latest_summary(cfg.lake), end="")
    return 0


def _leak_scan(args: argparse.Namespace) -> int:
    import json

    from ops import leakscan

    if args.detect:
        hits = leakscan.detect_scan(args.paths)
    else:
        hits = leakscan.scan(args.paths, leakscan.load_needles(args.ground_truth))
    print(json.dumps({"hits": hits, "count": len(hits)}, indent=2))
    return 1 if hits else 0


def _evaluate(args: argparse.Namespace) -> int:
    import json

    from core.config import load_config
    from core.stage import upstream
    from demo.groundtruth import evaluate

    cfg = load_config(args.config)
    c, d = (upstream(cfg.lake, args.run_id, s) for s in ("clean", "dedup"))
    threshold = d.manifest["config"]["dedup"]["threshold"]
    print(json.dumps(evaluate(args.ground_truth, c.path, d.path, threshold), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
