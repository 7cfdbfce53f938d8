"""The review loop against a real Label Studio (the session's ``label_studio`` server):
push pre-labeled rounds idempotently, annotate through its REST API as reviewers would,
pull into the lake's reviewer source, and the next label-QA run applies the reviews (its
key changes); Label Studio down, not configured, deleted and edited tasks, labels outside
the set and reviewers who disagree."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pandas as pd
import pytest
from test_labelqa import CLASSES, _fake_desensitize, _items_from_build

from core import labeling_auth, stage
from core.config import load_config
from quality import labelqa_stage, review, review_stage
from quality.labelqa import LS_FROM, LS_TO
from quality.labelstudio import Client, LabelStudioError


@pytest.fixture(scope="module")
def items(tmp_path_factory):
    found, true = _items_from_build(tmp_path_factory.mktemp("b") / "raw", 1500, 0.10, seed=11)
    return found.assign(true_label=true)


@pytest.fixture
def ls_env(label_studio, monkeypatch, tmp_path):
    url, creds = label_studio
    monkeypatch.setenv("INTENTOPS_LABEL_STUDIO_URL", url)
    monkeypatch.setenv("INTENTOPS_LABEL_STUDIO_TOKEN", creds.api_token)
    monkeypatch.setenv("INTENTOPS_REVIEWER_KEY", creds.reviewer_key)
    monkeypatch.setenv("INTENTOPS_SERVICES_ROOT", str(tmp_path / "services"))  # not the checkout's
    return url, creds


def _cfg(tmp_path, project: str, **over):
    return load_config(overrides={"lake_root": str(tmp_path / "lake"), "labeling.project": project,
                                  **over}, env={})


def _qa(cfg, run_id, items):
    _fake_desensitize(cfg.lake, run_id, items.drop(columns="true_label"))
    return labelqa_stage.run(cfg, run_id)


def test_push_rounds_pull_and_the_next_label_qa_applies_the_reviews(tmp_path, ls_env, mlflow_server,
                                                                    monkeypatch, items):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    url, creds = ls_env
    cfg = _cfg(tmp_path, "review-e2e", **{"labeling.batch_size": 15})
    qa1 = _qa(cfg, "r1", items)
    queue = pd.read_csv(f"{qa1.path}/relabel_queue.csv", dtype={"record_id": str})
    assert len(queue) > 20

    # Round 1: the 15 most valuable items, pre-labeled, with score and reason in the data.
    first = review_stage.run(cfg, "r1")
    s1 = first.manifest["stats"]
    assert (s1["sent"], s1["round"], s1["already_in_label_studio"]) == (15, 1, 0)
    client = Client(url, creds.api_token)
    pid = s1["project_id"]
    tasks = client.tasks(pid)
    assert len(tasks) == 15
    t0 = next(t for t in tasks if t["data"]["rank"] == min(x["data"]["rank"] for x in tasks))
    assert {"score", "reason", "record_id", "review_value"} <= set(t0["data"])
    assert t0["total_predictions"] == 1
    sent = pd.read_csv(f"{first.path}/sent.csv")
    assert list(sent.review_value) == sorted(sent.review_value, reverse=True)

    # The pull sensor waits labeling.pull_wait_minutes (5) after this run's push, no longer.
    assert not review_stage.waited_enough(cfg, "r1")
    assert review_stage.waited_enough(cfg, "r1", now=first.manifest["timings"]["started"] + 301)
    assert review_stage.waited_enough(cfg, "never-pushed")

    # Same run again: the stage's cache; a new run: round 2 sends the rest, nothing twice.
    assert review_stage.run(cfg, "r1").cache_hit
    cfg_all = _cfg(tmp_path, "review-e2e", **{"labeling.batch_size": 10_000})
    _qa(cfg_all, "r2", items)
    s2 = review_stage.run(cfg_all, "r2").manifest["stats"]
    assert (s2["sent"], s2["round"], s2["already_in_label_studio"]) == (len(queue) - 15, 2, 15)
    _qa(cfg_all, "r2b", items)
    assert review_stage.run(cfg_all, "r2b").cache_hit  # the same queue: no new round
    again, _ = review_stage.push(cfg_all, client, review_stage.read_queue(qa1.path), CLASSES, {}, "r2c")
    assert again["sent"] == 0 and again["already_in_label_studio"] == len(queue)  # nothing twice
    tasks = client.tasks(pid)
    assert sorted(t["data"]["record_id"] for t in tasks) == sorted(queue.record_id)

    # Reviewers answer through the REST API, as the UI does.
    r1 = client.create_user("rev-one@intentops.local", "rev-one")["id"]
    r2 = client.create_user("rev-two@intentops.local", "rev-two")["id"]
    by_rid = {t["data"]["record_id"]: t for t in tasks}
    truth = items.set_index("record_id").true_label
    q = queue.set_index("record_id")
    # An item whose consensus is wrong: the reviewer gives the true label.
    fix = next(r for r in q.index if q.consensus_label[r] != truth[r] and isinstance(q.consensus_label[r], str))
    tie, bad, edited, gone, gone_later = [r for r in q.index if r != fix][:5]
    client.annotate(by_rid[fix]["id"], LS_FROM, LS_TO, truth[fix], user=r1)
    other = next(c for c in CLASSES if c != truth[tie])
    client.annotate(by_rid[tie]["id"], LS_FROM, LS_TO, truth[tie], user=r1)
    client.annotate(by_rid[tie]["id"], LS_FROM, LS_TO, other, user=r2)
    client.annotate(by_rid[bad]["id"], LS_FROM, LS_TO, "not_an_intent", user=r2)
    client.annotate(by_rid[edited]["id"], LS_FROM, LS_TO, truth[edited], user=r2)
    client.update_task(by_rid[edited]["id"], {**by_rid[edited]["data"], "record_id": "someone-else"})
    client.annotate(by_rid[gone_later]["id"], LS_FROM, LS_TO, truth[gone_later], user=r1)
    client.delete_task(by_rid[gone]["id"])  # deleted before anyone reviewed it

    pulled = review_stage.pull(cfg)
    assert pulled["new_annotations"] == 6 and pulled["tasks_with_edited_record_id"] == 1
    assert review_stage.pull(cfg)["new_annotations"] == 0  # a second poll finds nothing new
    client.delete_task(by_rid[gone_later]["id"])  # deleted after its review was pulled
    assert review_stage.pull(cfg)["stored"] == 6  # what was pulled stays in the lake
    stored = review.ReviewStore(cfg.lake).annotations()
    assert set(stored.record_id) == {fix, tie, bad, edited, gone_later}  # the edited task keeps its record
    assert stored.reviewer.str.fullmatch(r"reviewer:[0-9a-f]{16}").all()
    assert not stored.reviewer.isin([str(r1), str(r2), "rev-one@intentops.local"]).any()

    # The model trained on the first label-QA output (before any review), as the train
    # stage tags its MLflow run: the next report quotes its accuracy as the baseline.
    from core import tracking

    tracking.log_stage_run(cfg, cfg.training.experiment, f"train-of-{qa1.key}", "train-r1", params={},
                           metrics={"test_accuracy": 0.61}, tags={"intentops.data.labelqa_key": qa1.key},
                           artifacts=[])
    # The next label-QA run: a new key (the reviewer source changed), the reviews applied.
    qa3 = _qa(cfg, "r3", items)
    assert qa3.key != qa1.key and not qa3.cache_hit
    cur = pd.read_parquet(f"{qa3.path}/curated").set_index("record_id")
    assert cur.label[fix] == truth[fix] and cur.label_source[fix] == "reviewer"
    assert cur.label[edited] == truth[edited]
    m = json.loads(Path(qa3.path, "metrics.json").read_text())
    rv = m["review"]
    assert rv["outside_label_set"] == 1 and rv["outside_label_set_examples"] == ["not_an_intent"]
    assert rv["unresolved_ties"] == 1 and rv["applied"] == 3
    assert [x["round"] for x in rv["rounds"]] == sorted({x["round"] for x in rv["rounds"]})
    assert sum(x["items_reviewed"] for x in rv["rounds"]) == 4  # bad's only label was kept out
    assert not any(a["annotator"].startswith("reviewer:") for a in m["agreement"].get("per_annotator") or [])
    q3 = pd.read_csv(f"{qa3.path}/relabel_queue.csv", dtype={"record_id": str}).set_index("record_id")
    assert fix not in q3.index and tie in q3.index and "reviewers disagree" in q3.reason[tie]
    assert rv["model_test_accuracy_before_reviews"] == 0.61
    assert all(x["model_test_accuracy_after"] is None for x in rv["rounds"])  # not trained yet
    report = Path(qa3.path, "qa_report.html").read_text()
    assert "Review rounds" in report and "model_test_accuracy_after" in report and "0.61" in report

    # Round 3 after the reviews: the deleted, never-reviewed task is sent again; nothing
    # reviewed is, even the one whose task was deleted after its review.
    s4 = review_stage.run(cfg_all, "r3").manifest["stats"]
    resent = pd.read_csv(f"{review_stage.stage.upstream(cfg.lake, 'r3', 'review').path}/sent.csv",
                         dtype={"record_id": str})
    assert gone in set(resent.record_id) and not set(resent.record_id) & {fix, gone_later}
    assert s4["sent"] == 1 and s4["round"] == 3
    client.close()


def test_label_studio_down_fails_clearly_and_nothing_is_lost(tmp_path, mlflow_server, monkeypatch, items):
    import socket

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("INTENTOPS_LABEL_STUDIO_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("INTENTOPS_LABEL_STUDIO_TOKEN", "t" * 40)
    monkeypatch.setenv("INTENTOPS_REVIEWER_KEY", "k" * 64)
    cfg = _cfg(tmp_path, "review-down")
    qa = _qa(cfg, "r1", items)
    with pytest.raises(LabelStudioError, match="not answering"):
        review_stage.run(cfg, "r1")
    assert not list((cfg.lake / "review").glob("*/_MANIFEST.json"))  # nothing published as done
    assert len(pd.read_csv(f"{qa.path}/relabel_queue.csv")) > 0  # the queue is still in the lake


@pytest.mark.parametrize(("enabled", "outcome"), [
    ("auto", "skipped: no Label Studio configured"),
    ("off", "labeling.enabled is off"),
    ("on", "labeling.enabled is on but no Label Studio configured"),
])
def test_without_label_studio_the_push_says_why(tmp_path, monkeypatch, enabled, outcome):
    for var in ("INTENTOPS_LABEL_STUDIO_URL", "INTENTOPS_LABEL_STUDIO_TOKEN", "INTENTOPS_REVIEWER_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("INTENTOPS_SERVICES_ROOT", str(tmp_path / "services"))  # no credentials there
    cfg = _cfg(tmp_path, "none", **{"labeling.enabled": enabled})
    expected = stage.StageError if enabled == "on" else stage.StageSkipped
    with pytest.raises(expected, match=outcome) as info:
        review_stage.run(cfg, "r1")
    assert (type(info.value) is stage.StageError) == (enabled == "on")  # on: a failure, not a skip


def _rows(*anns):
    return pd.DataFrame([{"record_id": r, "project": 1, "task_id": 1, "annotation_id": i, "reviewer": who,
                          "label": lab, "suggested_label": "card_arrival", "round": 1,
                          "created_at": t, "updated_at": t}
                         for i, (r, who, lab, t) in enumerate(anns)], columns=review.COLUMNS)


@pytest.mark.parametrize(("anns", "expected"), [
    ([("a", "x", "card_arrival", "1")], "card_arrival"),  # one reviewer
    ([("a", "x", "card_arrival", "1"), ("a", "y", "age_limit", "2")], None),  # a tie: unresolved
    ([("a", "x", "card_arrival", "1"), ("a", "y", "age_limit", "2"), ("a", "z", "age_limit", "3")],
     "age_limit"),  # the majority of reviewers
    ([("a", "x", "card_arrival", "1"), ("a", "x", "age_limit", "2")], "age_limit"),  # latest word counts once
    ([("a", "x", "Card Arrival", "1")], "card_arrival"),  # canonicalized like every label
    ([("a", "x", "nonsense", "1"), ("a", "y", "age_limit", "2")], "age_limit"),  # outside the set: kept out
])
def test_the_reviewers_rule(anns, expected):
    res, info = review.resolve(_rows(*anns), CLASSES)
    got = res.set_index("record_id").reviewed_label.get("a")
    assert got == expected
    assert info["outside_label_set"] == sum(a[2] == "nonsense" for a in anns)


def test_review_value_orders_by_score_and_favours_small_classes():
    q = pd.DataFrame({"rank": [1, 2, 3], "record_id": ["a", "b", "c"], "score": [0.9, 0.6, 0.6],
                      "suggested_label": ["big", "small", "big"]})
    out = review.order_by_value(q, {"big": 100, "small": 10}, weight=1.0)
    # b: 0.6 x (1 + 1 x (1 - 10/100)) = 1.14 beats a's 0.9: a fix in a small class is worth more.
    assert list(out.record_id) == ["b", "a", "c"]
    plain = review.order_by_value(q, {"big": 100, "small": 10}, weight=0.0)
    assert list(plain.review_value) == [0.9, 0.6, 0.6]


def test_credentials_are_generated_once_private_and_beside_the_registrys(tmp_path):
    from core import registry_auth

    path = tmp_path / "credentials.json"
    registry_auth.RegistryCredentials.load_or_create(path)
    a = labeling_auth.LabelStudioCredentials.load_or_create(path)
    b = labeling_auth.LabelStudioCredentials.load_or_create(path)
    assert a == b and len(a.api_token) == 40 and a.admin_password not in ("change-me", "")
    data = json.loads(path.read_text())
    assert set(data) == {"mlflow", "label_studio"}
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert labeling_auth.pseudonym(7, a.reviewer_key) == labeling_auth.pseudonym("7", a.reviewer_key)
    assert labeling_auth.pseudonym(7, a.reviewer_key) != labeling_auth.pseudonym(7, "another key")


def test_services_lists_label_studio_with_its_url_and_credentials(tmp_path, monkeypatch):
    from ops.services import Services

    monkeypatch.setenv("INTENTOPS_SERVICES_ROOT", str(tmp_path / "services"))
    monkeypatch.delenv("INTENTOPS_LABEL_STUDIO_PORT", raising=False)
    svc = Services(load_config(overrides={"lake_root": str(tmp_path / "lake")}, env={}))
    got = svc.describe({})["label_studio"]
    assert got["url"] == "http://127.0.0.1:8300" and got["running"] is False
    assert got["credentials_file"].endswith("credentials.json") and got["credentials_key"] == "label_studio"
    # Airflow's tasks find it through the environment `up` gives them.
    assert svc.env()["INTENTOPS_LABEL_STUDIO_URL"] == "http://127.0.0.1:8300"


def test_cli_run_goes_on_past_a_failed_push_but_not_past_a_failed_stage_others_read(tmp_path, monkeypatch, capsys):
    """`intentops run`: the review push is a side branch (train does not read it), so Label
    Studio being down fails it alone, as in the DAG; any other failure stops the run."""
    from ops import cli

    ran = []

    def one(name, cfg, run_id):
        ran.append(name)
        if name in fail:
            raise LabelStudioError(f"{name} down")

    monkeypatch.setattr(cli, "_run_one", one)
    argv = ["run", "--through", "train", "--set", f"lake_root={tmp_path / 'lake'}", "--run-id", "r"]
    fail = {"review"}
    assert cli.main(argv) == 2 and ran[-2:] == ["review", "train"]
    assert "ERROR in review (no later stage needs it" in capsys.readouterr().err
    ran.clear()
    fail = {"labelqa"}
    assert cli.main(argv) == 2 and ran[-1] == "labelqa"  # train reads label QA: stopped there


def test_queue_rows_without_consensus_or_suggestion_become_valid_json_tasks(tmp_path):
    from quality.labelqa import label_studio_tasks

    pd.DataFrame({"rank": [1, 2], "record_id": ["a", "b"], "text": ["where is my card", "hello"],
                  "given_label": ["card_arrival", None], "annotations": ["", ""],
                  "consensus_label": ["card_arrival", None], "item_agreement": [None, None],
                  "suggested_label": ["card_arrival", None], "score": [0.7, 1.0],
                  "reason": ["low label quality", "no valid label"],
                  "dedup_label_conflict": [False, False]}).to_csv(tmp_path / "relabel_queue.csv", index=False)
    tasks = label_studio_tasks(review_stage.read_queue(tmp_path))
    json.dumps(tasks, allow_nan=False)  # what the import sends: no NaN anywhere
    assert "predictions" in tasks[0] and "predictions" not in tasks[1]


def test_accuracy_after_each_round_is_the_first_training_on_its_labels():
    published = [{"key": "k0", "last_round": 0}, {"key": "k0b", "last_round": 0},
                 {"key": "k1", "last_round": 1}, {"key": "k1b", "last_round": 1}, {"key": "k2", "last_round": 2}]
    trainings = [{"labelqa_key": "k0", "start": 1, "test_accuracy": 0.70, "run_id": "a"},
                 {"labelqa_key": "k0b", "start": 2, "test_accuracy": 0.71, "run_id": "b"},
                 {"labelqa_key": "k1", "start": 3, "test_accuracy": 0.74, "run_id": "c"},
                 {"labelqa_key": "k1b", "start": 4, "test_accuracy": 0.90, "run_id": "d"},  # a later retrain
                 {"labelqa_key": "k2", "start": 5, "test_accuracy": None, "run_id": "e"},  # failed before test
                 {"labelqa_key": "other", "start": 6, "test_accuracy": 0.99, "run_id": "f"}]
    after, before = review.accuracy_after_rounds(published, trainings)
    assert before == {"test_accuracy": 0.71, "training_run": "b"}  # the last model before any review
    assert after == {1: {"test_accuracy": 0.74, "training_run": "c"}}  # round 2's model: none yet
    assert review.accuracy_after_rounds([], trainings) == ({}, None)
