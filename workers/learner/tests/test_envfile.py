"""The learner reads `.env` like the TypeScript CLI and workers: fills in, never overrides."""

from halo_learner.envfile import load_dotenv, parse_env


def test_parse_env_syntax():
    text = (
        "# keys\nOPENAI_API_KEY=sk-1\nexport HALO_LOG_LEVEL=debug\nQ=\"a b # kept\"\nS='x'\nC=1 # comment\nnot a line\n"
    )
    assert parse_env(text) == {
        "OPENAI_API_KEY": "sk-1",
        "HALO_LOG_LEVEL": "debug",
        "Q": "a b # kept",
        "S": "x",
        "C": "1",
    }


def test_load_dotenv_never_overrides(tmp_path):
    f = tmp_path / ".env"
    f.write_text("HALO_MODEL=from-file\nHALO_GPU_QUEUE=file-queue\nEMPTY=file\n")
    env = {"HALO_GPU_QUEUE": "set", "EMPTY": ""}
    assert load_dotenv(env, f) == ["HALO_MODEL"]
    assert env == {"HALO_GPU_QUEUE": "set", "EMPTY": "", "HALO_MODEL": "from-file"}
    assert load_dotenv({}, tmp_path / "missing") == []
    named = {"HALO_ENV_FILE": str(f)}
    load_dotenv(named)
    assert named["HALO_MODEL"] == "from-file"
    assert load_dotenv({"HALO_ENV_FILE": ""}) == []


def test_shared_fixture_gives_the_same_map_as_the_node_side():
    # test/unit/env-file.test.ts asserts the same map (expected.json, written by the npm dotenv parser) on this file.
    import json
    from pathlib import Path

    fixtures = Path(__file__).resolve().parents[3] / "test" / "fixtures" / "dotenv"
    with open(fixtures / "grammar.env", encoding="utf-8", newline="") as f:
        text = f.read()
    expected = json.loads((fixtures / "expected.json").read_text(encoding="utf-8"))
    assert parse_env(text) == expected
    assert expected["HASH_NO_SPACE"] == "abc"
    assert expected["MULTI_DOUBLE"] == "line one\nline two\n  line three"
    env: dict[str, str] = {}
    load_dotenv(env, fixtures / "grammar.env")
    assert env == expected
