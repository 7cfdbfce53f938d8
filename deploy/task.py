"""The deploy stage as the DAG runs it: canary rollout of the run's exported version.

Probe traffic is the curated test split (desensitized, labeled, held out from training),
so the load generator sends no personal data and the accuracy check has ground truth.
The stage is keyed by the export output and the deploy config: a rerun is a cache hit
that returns the recorded decision instead of rolling out twice; ``ensure_serving``
then restarts the stable model if the deployment was stopped since.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from core import stage, stages
from core.config import PipelineConfig
from deploy import canary, deployment

log = logging.getLogger(__name__)
DEPLOY = "deploy"
FAILED_DECISIONS = ("rolled_back", "refused")


def ensure_serving(cfg: PipelineConfig) -> dict[str, Any] | None:
    """Router and stable server up (the champion's build when nothing runs)."""
    dep = deployment.Deployment(cfg)
    state = dep.state()
    dep.ensure_router(state)
    stable = dep.ensure_stable(state, cfg.training.registered_model)
    if stable:
        dep.ensure_autoscaler(state)
    return stable


def router_url(cfg: PipelineConfig) -> str:
    router = deployment.Deployment(cfg).state().get("router")
    return router["url"] if router else f"http://{cfg.deploy.host}:{cfg.deploy.router_port}"


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    import pandas as pd

    exp = stage.upstream(cfg.lake, run_id, "export")
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    inputs = {"export": {"key": exp.manifest["key"]}}
    stage_cfg = {"deploy": cfg.deploy.model_dump(), "model": cfg.training.registered_model}
    code = stages.code_version(DEPLOY)

    def work(out: Path) -> dict[str, Any]:
        es = exp.manifest["stats"]
        if not es.get("exported"):
            reason = f"nothing to deploy: {es.get('reason')}"
            log.info("deploy skipped: %s", reason)
            return {"rows_in": None, "kept": None, "decision": "skipped", "reason": reason}
        cur = pd.read_parquet(Path(qa.path) / "curated", columns=["text", "label", "split"])
        test = cur[cur.split == "test"]
        res = canary.rollout(cfg, str(es["model_version"]), test.text.tolist(), test.label.tolist(), out)
        return {"rows_in": None, "kept": None,
                **{k: v for k, v in res.items() if k not in ("timeline", "events")}}

    return stage.run_stage(DEPLOY, cfg.lake, inputs, stage_cfg, code, work, run_id)


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    """A rollback or a refused build is a verdict (StageVerdict, with the reason); after a
    promotion (or a rerun of one) the stable model is kept serving, restarted if the
    deployment was stopped since."""
    s = result.manifest["stats"]
    if s["decision"] in FAILED_DECISIONS:
        raise stage.StageVerdict(f"version {s.get('version')} {s['decision']}: {s['reason']}")
    line = f"deploy: {s['decision']}: {s['reason']}"
    if s["decision"] in ("promoted", "already_serving"):
        stable = ensure_serving(cfg)  # a cache hit after `intentops deploy stop`
        line += (f"; serving version {stable and stable['version']} behind the router at "
                 f"{router_url(cfg)}")
    return line
