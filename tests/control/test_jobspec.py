"""JobSpec: valid specs load from YAML, JSON and dicts; malformed, huge and hostile ones are refused with
messages naming the field and the file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from control.jobspec import MAX_SPEC_BYTES, JobSpec
from core.errors import InputError

BASE = {
    "name": "ppo-demo",
    "workload": "ppo",
    "entrypoint": "python -m verl.trainer.main_ppo",
    "owner": "alice",
}


def spec(**changes: object) -> JobSpec:
    return JobSpec.from_dict({**BASE, **changes})


def refused(match: str, **changes: object) -> InputError:
    with pytest.raises(InputError, match=match) as info:
        spec(**changes)
    return info.value


def test_full_yaml_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "name: grpo-7b\nworkload: grpo\nentrypoint: python -m verl.trainer.main_ppo trainer.nnodes=2\n"
        "nnodes: 2\ngpus_per_node: 8\npool: a100\nlabels: {zone: rack-3, example.com/tier: gold}\n"
        "code_path: /mnt/shared/common/code/verl-v2\nenv: {NCCL_DEBUG: INFO, HF_HOME: /mnt/shared/hf}\n"
        "working_dir: /mnt/shared/users/alice\ntimeout_s: 3600\nresume: true\nowner: alice\n"
        "submission_id: grpo-7b-run.1\n"
    )
    s = JobSpec.load(path)
    assert (s.workload, s.nnodes, s.gpus_per_node, s.resume, s.timeout_s) == ("grpo", 2, 8, True, 3600.0)
    assert s.label_selector == {"zone": "rack-3", "example.com/tier": "gold", "argus.io/pool": "a100"}
    assert s.env["NCCL_DEBUG"] == "INFO" and s.submission_id == "grpo-7b-run.1"
    # the snapshot written into the job folder loads back to the same spec
    assert JobSpec.from_text(s.to_yaml()) == s


def test_json_file_loads_and_defaults_apply(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(json.dumps(BASE))
    s = JobSpec.load(path)
    assert (s.nnodes, s.gpus_per_node, s.resume, s.timeout_s, s.code_path) == (1, 0, False, None, None)


def test_shell_metacharacters_in_the_entrypoint_are_data() -> None:
    hostile = "python train.py; rm -rf / && echo $(id) `uname` | tee x > /dev/null\n# more"
    assert spec(entrypoint=hostile).entrypoint == hostile


def test_unknown_field_is_named_with_the_file(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: a\nentrypoint: e\nowner: bob\nnum_gpu: 4\n")
    with pytest.raises(InputError, match=r"job\.yaml.*unknown field 'num_gpu'") as info:
        JobSpec.load(path)
    assert "gpus_per_node" in (info.value.hint or "")


def test_missing_required_fields_are_named() -> None:
    with pytest.raises(InputError, match="field 'entrypoint' is required.*field 'owner' is required"):
        JobSpec.from_dict({"name": "x"})


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("name", "../etc", "field 'name'"),
        ("name", "a" * 41, "field 'name'"),
        ("name", "job name", "field 'name'"),
        ("name", "jöb", "field 'name'"),
        ("submission_id", "..", "field 'submission_id'"),
        ("submission_id", "../../x", "field 'submission_id'"),
        ("submission_id", "a/b", "field 'submission_id'"),
        ("submission_id", "x" * 65, "field 'submission_id'"),
        ("submission_id", "id;rm -rf /", "field 'submission_id'"),
        ("owner", "root; reboot", "field 'owner'"),
        ("owner", "..", "field 'owner'"),
        ("owner", "Alice", "field 'owner'"),
        ("workload", "rlhf", "field 'workload'"),
        ("nnodes", 0, "field 'nnodes'"),
        ("nnodes", 1025, "field 'nnodes'"),
        ("nnodes", "2", "field 'nnodes'"),
        ("nnodes", True, "field 'nnodes'"),
        ("gpus_per_node", 17, "field 'gpus_per_node'"),
        ("gpus_per_node", -1, "field 'gpus_per_node'"),
        ("timeout_s", 0, "field 'timeout_s'"),
        ("timeout_s", "1h", "field 'timeout_s'"),
        ("resume", "yes", "field 'resume'"),
        ("entrypoint", "   ", "field 'entrypoint'"),
        ("entrypoint", "x" * 20_000, "field 'entrypoint'"),
        ("entrypoint", "a\x00b", "field 'entrypoint'"),
        ("pool", "a b", "field 'pool'"),
        ("pool", "-x", "field 'pool'"),
    ],
)
def test_bad_scalar_values_are_refused(field: str, value: object, match: str) -> None:
    refused(match, **{field: value})


@pytest.mark.parametrize(
    "path",
    [
        "relative/code",
        "/mnt/shared/../../etc",
        "/mnt/shared/code/..",
        "/a:/b",  # would add a second PYTHONPATH entry
        "/a/$HOME",  # Ray expands $VAR in env values
        "/a b",
        "/a\nb",
        "/a;rm -rf /",
        "/" + "a" * 2000,
    ],
)
@pytest.mark.parametrize("field", ["code_path", "working_dir"])
def test_hostile_paths_are_refused(field: str, path: str) -> None:
    refused(f"field '{field}'", **{field: path})


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"lower": "x"}, "must match"),
        ({"A-B": "x"}, "must match"),
        ({"X;Y": "x"}, "must match"),
        ({"PYTHONPATH": "/x"}, "use code_path"),
        ({"RAY_ADDRESS": "x"}, "reserved prefix"),
        ({"ARGUS_JOB_DIR": "/tmp"}, "reserved prefix"),
        ({"X": "a\x00b"}, "NUL"),
        ({"X": "v" * 40_000}, "longer than"),
        ({f"K{i}": "v" for i in range(200)}, "more than"),
        ({f"K{i}": "v" * 30_000 for i in range(5)}, "in all"),
        ({"X": 1}, "field 'env.X'"),
    ],
)
def test_bad_env_is_refused(env: dict, match: str) -> None:
    refused(match, env=env)


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        ({"a b": "x"}, "label key"),
        ({"ray.io/node-id": "x"}, "reserved prefix"),
        ({"zone": "rack 3"}, "label value"),
        ({"zone": ""}, "label value"),
        ({"zone": "$(id)"}, "label value"),
        ({"pool": "b"}, "names two pools"),
    ],
)
def test_bad_labels_are_refused(labels: dict, match: str) -> None:
    refused(match, labels=labels, pool="a")


def test_resources_pin_the_driver_and_load_back_from_the_snapshot() -> None:
    s = spec(resources={"gpu-07": 0.001, "nvme": 1})
    assert s.resources == {"gpu-07": 0.001, "nvme": 1.0}
    assert JobSpec.from_text(s.to_yaml()) == s
    assert spec().resources == {}


@pytest.mark.parametrize(
    ("resources", "match"),
    [
        ({"CPU": 1}, "built-in"),
        ({"GPU": 1}, "built-in"),
        ({"a b": 1}, "resource name"),
        ({"$(id)": 1}, "resource name"),
        ({"gpu-07": 0}, "more than 0"),
        ({"gpu-07": -1}, "more than 0"),
        ({"gpu-07": float("nan")}, "more than 0"),
        ({"gpu-07": float("inf")}, "at most"),
        ({"gpu-07": True}, "resources.gpu-07"),
        ({"gpu-07": "1"}, "resources.gpu-07"),
        ({f"r{i}": 1 for i in range(40)}, "more than 32"),
    ],
)
def test_bad_resources_are_refused(resources: dict, match: str) -> None:
    refused(match, resources=resources)


def test_huge_file_is_refused_by_size_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with path.open("wb") as fh:
        fh.truncate(10 * 1024 * 1024)  # 10 MB of NULs: reading or parsing it would be the mistake
    with pytest.raises(
        InputError, match=rf"huge\.yaml is 10485760 bytes, over the {MAX_SPEC_BYTES}-byte limit"
    ):
        JobSpec.load(path)
    with pytest.raises(InputError, match="over the"):
        JobSpec.from_text("a" * (MAX_SPEC_BYTES + 1), source="the request body")


def test_billion_laughs_and_duplicate_keys_are_refused() -> None:
    laughs = 'a: &a ["lol","lol"]\nb: &b [*a,*a]\nc: &c [*b,*b]\nd: [*c,*c]\n'
    with pytest.raises(InputError, match="anchors"):
        JobSpec.from_text(laughs, source="laughs.yaml")
    with pytest.raises(InputError, match=r"line 4.*duplicate key 'name'"):
        JobSpec.from_text("name: a\nentrypoint: e\nowner: bob\nname: b\n", source="dup.yaml")
    with pytest.raises(InputError, match="duplicate key 'owner'"):
        JobSpec.from_text('{"name":"a","entrypoint":"e","owner":"bob","owner":"eve"}', "json")


@pytest.mark.parametrize(
    ("text", "fmt", "match"),
    [
        ("name: [unclosed\n", "yaml", r"not valid YAML at line \d+"),
        ("- a\n- b\n", "yaml", "must be a mapping"),
        ("", "yaml", "must be a mapping"),
        ("!!python/object/apply:os.system ['id']", "yaml", "not valid YAML"),
        ('{"name": ', "json", r"not valid JSON at line 1"),
        ("[" * 100_000, "json", "nested too deeply|not valid JSON"),
        ("[1]", "json", "must be a mapping"),
        ("name: a", "toml", "unknown job spec format"),
    ],
)
def test_malformed_text_is_refused(text: str, fmt: str, match: str) -> None:
    with pytest.raises(InputError, match=match):
        JobSpec.from_text(text, fmt, source="spec")


def test_file_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        JobSpec.load(tmp_path / "missing.yaml")
    with pytest.raises(InputError, match=r"must end in \.yaml"):
        JobSpec.load(tmp_path / "job.txt")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(InputError, match=r"latin1\.yaml is not UTF-8"):
        JobSpec.load(bad)


def test_error_messages_stay_short_for_huge_values() -> None:
    err = refused("field 'name'", name="x" * 100_000)
    assert len(str(err)) < 1000
    err = refused("field 'nnodes'", nnodes=[list(range(10_000))])
    assert len(str(err)) < 1000
