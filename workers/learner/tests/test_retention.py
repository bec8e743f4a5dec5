"""Adapter retention: the last K whole, older ones without optimiser state, needed versions untouched."""

from __future__ import annotations

import json
import random

from conftest import messages, png_ref, tokens_ref
from halo_learner import adapters, retention
from halo_learner.learner import Learner, Settings
from halo_learner.memory import OomHints
from halo_learner.payloads import UpdatePolicyInput


def _fake_versions(run_dir, n):
    for v in range(1, n + 1):
        d = run_dir / f"v{v}"
        d.mkdir(parents=True)
        for f in (adapters.ADAPTER_FILE, adapters.CONFIG_FILE, adapters.OPTIMIZER_FILE):
            (d / f).write_bytes(b"x" * 100)
        (d / adapters.MANIFEST_FILE).write_text(
            json.dumps(
                {
                    "version": v,
                    "files": {adapters.ADAPTER_FILE: "a", adapters.CONFIG_FILE: "c", adapters.OPTIMIZER_FILE: "o"},
                }
            )
        )


def test_plan_keeps_what_it_must(tmp_path):
    run = tmp_path / "run"
    _fake_versions(run, 12)
    (run / ".v13.tmp-1-x").mkdir()  # a writer's temp folder is not a version
    strip = retention.plan(run, keep_last=3, keep_every=5, needed={2})
    assert [(a.kind, a.version) for a in strip] == [("strip-optimizer", v) for v in (1, 3, 4, 5, 6, 7, 8, 9)]
    gc = retention.plan(run, keep_last=3, keep_every=5, needed={2, 7}, delete=True)
    assert {a.version: a.kind for a in gc} == {
        1: "delete",
        3: "delete",
        4: "delete",
        5: "strip-optimizer",
        6: "delete",
        8: "delete",
        9: "delete",
    }
    assert all(p.exists() for p in run.iterdir())  # planning changes nothing

    freed = retention.apply(gc)
    left = sorted(int(p.name[1:]) for p in run.glob("v*"))
    assert left == [2, 5, 7, 10, 11, 12] and freed == sum(a.bytes for a in gc) > 6 * 300 + 100
    for v in (2, 7, 10, 11, 12):  # needed and the last three stay whole
        assert (run / f"v{v}" / adapters.OPTIMIZER_FILE).exists()
    five = run / "v5"
    assert not (five / adapters.OPTIMIZER_FILE).exists() and (five / adapters.ADAPTER_FILE).exists()
    m = adapters.read_manifest(five)
    assert m["optimizer_pruned"] is True and adapters.OPTIMIZER_FILE not in m["files"]
    assert not list(run.glob(".v*.deleting"))


def test_cli_dry_run_changes_nothing(tmp_path, capsys):
    _fake_versions(tmp_path / "r", 6)
    assert (
        retention.main(
            ["--run", "r", "--root", str(tmp_path), "--keep-last", "2", "--delete", "--dry-run", "--need", "1"]
        )
        == 0
    )
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["version"] for x in lines[:-1]] == [2, 3, 4] and lines[-1]["dry_run"] is True
    assert len(list((tmp_path / "r").glob("v*"))) == 6 and (tmp_path / "r" / "v2" / adapters.OPTIMIZER_FILE).exists()


def test_learner_strips_optimizer_state_beyond_the_last_k(policy, blobs, tmp_path):
    learner = Learner(
        policy,
        blobs=blobs,
        checkpoints=tmp_path / "ck",
        settings=Settings(micro_batch=4, keep_last=2),
        oom_hints=OomHints(tmp_path / "h.json"),
    )
    m = messages(png_ref(blobs, 64, 64, 3), "Goal: y")
    rnd = random.Random(1)
    for v in (1, 2, 3, 4):
        ref = blobs.put_json(
            {
                "items": [
                    {
                        "prompt": m,
                        "completion": "",
                        "advantage": a,
                        "tokens_ref": tokens_ref(blobs, [rnd.randrange(10, 390) for _ in range(3)]),
                    }
                    for a in (1.0, -1.0)
                ],
                "max_completion_len": 4,
            }
        )
        learner.update_policy(
            UpdatePolicyInput(run_id="keep", version=v, batch_ref=ref, hyperparameters={"learning_rate": 1e-3})
        )
    run = tmp_path / "ck" / "keep"
    assert [(run / f"v{v}" / adapters.OPTIMIZER_FILE).exists() for v in (1, 2, 3, 4)] == [False, False, True, True]
    assert all((run / f"v{v}" / adapters.ADAPTER_FILE).exists() for v in (1, 2, 3, 4))


def test_keep_last_below_one_is_refused_everywhere(tmp_path, capsys):
    """keep_last 0 would take the newest version (the next update's parent) and its optimiser state."""
    import pytest

    run = tmp_path / "r"
    _fake_versions(run, 4)
    for k in (0, -1):
        with pytest.raises(ValueError, match="1 or more"):
            retention.plan(run, keep_last=k, delete=True)
        with pytest.raises(ValueError, match="1 or more"):
            retention.prune_after_update(tmp_path, "r", keep_last=k)
    with pytest.raises(SystemExit) as e:
        retention.main(["--run", "r", "--root", str(tmp_path), "--keep-last", "0", "--delete"])
    assert e.value.code == 2 and "--keep-last 0: 1 or more" in capsys.readouterr().err
    for env in ({"HALO_KEEP_VERSIONS": "0"}, {"HALO_KEEP_VERSIONS": "-2"}, {"HALO_KEEP_VERSIONS": "all"}):
        with pytest.raises(ValueError, match="HALO_KEEP_VERSIONS"):
            retention.keep_last_from_env(env)
    assert retention.keep_last_from_env({}) == retention.DEFAULT_KEEP_LAST
    assert retention.keep_last_from_env({"HALO_KEEP_VERSIONS": "1"}) == 1
    # Nothing was touched by any of the refusals.
    assert all((run / f"v{v}" / adapters.OPTIMIZER_FILE).exists() for v in (1, 2, 3, 4))


def test_need_from_keeps_an_open_runs_adapter_its_parent_and_newer(tmp_path, capsys):
    run = tmp_path / "r"
    _fake_versions(run, 9)
    acts = retention.plan(run, keep_last=1, keep_every=0, needed={2}, delete=True, needed_from=6)
    assert [(a.kind, a.version) for a in acts] == [("delete", v) for v in (1, 3, 4, 5)]
    assert (
        retention.main(
            [
                "--run",
                "r",
                "--root",
                str(tmp_path),
                "--keep-last",
                "1",
                "--keep-every",
                "0",
                "--need",
                "2",
                "--need-from",
                "6",
                "--delete",
            ]
        )
        == 0
    )
    assert sorted(int(p.name[1:]) for p in run.glob("v*")) == [2, 6, 7, 8, 9]
