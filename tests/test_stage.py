"""Stage transactions: cache hits, atomic publish, leftovers of killed attempts."""

from __future__ import annotations

import json

import pytest

from core import stage


def _work(calls: list[int], rows: int = 3):
    def work(out):
        calls.append(1)
        (out / "data.txt").write_text("x" * rows)
        return {"rows_in": rows, "kept": rows}

    return work


def test_second_run_is_a_cache_hit(lake):
    calls: list[int] = []
    a = stage.run_stage("s", lake, {"in": "v1"}, {"k": 1}, "code1", _work(calls), run_id="r1")
    b = stage.run_stage("s", lake, {"in": "v1"}, {"k": 1}, "code1", _work(calls), run_id="r2")
    assert (a.cache_hit, b.cache_hit) == (False, True)
    assert calls == [1]
    assert a.path == b.path
    assert b.manifest["stats"] == {"rows_in": 3, "kept": 3}
    # Each run records which output it used.
    assert stage.upstream(lake, "r2", "s").path == a.path


@pytest.mark.parametrize(
    "change",
    [{"inputs": {"in": "v2"}}, {"config": {"k": 2}}, {"code": "code2"}],
)
def test_any_change_is_a_new_key(lake, change):
    base = {"inputs": {"in": "v1"}, "config": {"k": 1}, "code": "code1"}
    a = stage.run_stage("s", lake, base["inputs"], base["config"], base["code"], _work([]))
    new = base | change
    b = stage.run_stage("s", lake, new["inputs"], new["config"], new["code"], _work([]))
    assert a.key != b.key and not b.cache_hit
    assert (lake / "s" / a.key / stage.MANIFEST).exists()  # the old output is untouched


def test_manifest_has_lineage(lake):
    r = stage.run_stage("s", lake, {"in": "v1"}, {"k": 1}, "code1", _work([]), run_id="r")
    m = json.loads((lake / "s" / r.key / stage.MANIFEST).read_text())
    assert {"inputs", "config", "code_version", "stats", "timings", "package_version"} <= m.keys()
    assert m["inputs"] == {"in": "v1"} and m["config"] == {"k": 1}


def test_failed_work_publishes_nothing(lake):
    def boom(out):
        (out / "half.txt").write_text("partial")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        stage.run_stage("s", lake, {"in": "v1"}, {}, "c", boom)
    assert list((lake / "s").iterdir()) == []


def test_leftover_temp_dir_is_removed_on_retry(lake):
    key = stage.stage_key("s", {"in": "v1"}, {}, "c")
    stale = lake / "s" / f".tmp-{key}-deadbeef"
    stale.mkdir(parents=True)
    (stale / "half.parquet").write_text("partial")
    r = stage.run_stage("s", lake, {"in": "v1"}, {}, "c", _work([]))
    assert not stale.exists()
    assert sorted(p.name for p in (lake / "s").iterdir()) == [r.key]


def test_file_fingerprint_is_by_content(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    a.write_text("x,y\n1,2\n")
    b.write_text("x,y\n1,2\n")
    assert stage.file_fingerprint(a)["sha256"] == stage.file_fingerprint(b)["sha256"]
    b.write_text("x,y\n1,3\n")
    assert stage.file_fingerprint(a)["sha256"] != stage.file_fingerprint(b)["sha256"]
    with pytest.raises(stage.StageError, match="not found"):
        stage.file_fingerprint(tmp_path / "missing.csv")


def test_upstream_missing_is_a_clear_error(lake):
    with pytest.raises(stage.StageError, match="no clean output"):
        stage.upstream(lake, "run-x", "clean")
