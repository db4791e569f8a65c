"""Fuzzing `rlinf-embodied config show` with random overrides of every config field.

Seeded and bounded (CASES cases in-process through typer's CliRunner). Each case is one
override of one leaf field of a shipped job (every env and policy type's fields included): a
misspelt key, a value of the wrong type, an out-of-range number, malformed YAML syntax, or the
field's own value. Invalid input must end with a non-zero exit code and exactly one line
``error: ...`` (no traceback); valid input must exit 0 and print the value it was given.
"""

import dataclasses
import random
import typing
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlinf_embodied.cli import app
from rlinf_embodied.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CASES = 300
BASES = {  # a shipped job per env / policy type (cnn: the MLP job with its type and obs switched)
    ("maniskill", "mlp"): ("maniskill_pushcube_ppo_mlp.yaml", []),
    ("maniskill", "cnn"): ("maniskill_pushcube_ppo_mlp.yaml", ["policy.type=cnn", "env.obs_mode=rgb"]),
    ("gym", "mlp"): ("gym_pointreach_ppo_mlp.yaml", []),
    ("maniskill", "openvla"): ("maniskill_ppo_openvla_tiny.yaml", []),
    ("libero", "openvla_oft"): ("libero_spatial_grpo_openvla_oft_tiny.yaml", []),
    ("libero", "pi0"): ("libero_spatial_grpo_pi0_tiny.yaml", []),
    ("libero", "pi05"): ("libero_spatial_grpo_pi05_tiny.yaml", []),
}
MALFORMED = ["'", '"abc', "[1, 2", "{a: 1", "]", "}", "{a: [1}", "%x", "@x", "`x",
             "!!python/object/apply:os.system ['true']", "'a' 'b'", "a: b: c", "[1, {2: }"]
WRONG = {int: ["abc", "[1, 2]", "{a: 1}", "1.5", "true?", "''"],
         float: ["abc", "[0.1]", "{x: 1}", "1e", "--1"],
         bool: ["maybe", "[true]", "{b: 1}", "2.5", "yes please"],
         str: ["[a, b]", "{k: v}"],
         list: ["{a: 1}", "abc", "3"],
         dict: ["[1, 2]", "abc", "3"]}
OUT_OF_RANGE = ["-1", "0", "-1000000", "1000000000000", "-0.5", "1.5", ".nan", ".inf", "-.inf"]


def leaf_fields(obj, prefix=""):
    """(dotted key, annotation, value) of every non-dataclass field of a config dataclass."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            yield from leaf_fields(v, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hints[f.name], v


def base_kind(hint):
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin in (list, typing.List) or hint is list:
        return list
    if origin in (dict, typing.Dict) or hint is dict:
        return dict
    if args and origin is typing.Union:
        return base_kind(args[0])
    return hint if hint in (int, float, bool, str) else str


def typo(key, rng):
    parts = key.split(".")
    leaf = list(parts[-1])
    i = rng.randrange(len(leaf))
    op = rng.choice(["drop", "double", "swap", "suffix"])
    if op == "drop" and len(leaf) > 1:
        del leaf[i]
    elif op == "swap" and len(leaf) > 1:
        j = (i + 1) % len(leaf)
        leaf[i], leaf[j] = leaf[j], leaf[i]
    elif op == "double":
        leaf.insert(i, leaf[i])
    if "".join(leaf) == parts[-1]:
        leaf.append("_x")
    return ".".join(parts[:-1] + ["".join(leaf)])


def make_cases(seed=0, n=CASES):
    rng = random.Random(seed)
    pools = []
    for (_, _), (name, pre) in BASES.items():
        cfg = load_config(CONFIGS / name, pre)
        pools.append((name, pre, [x for x in leaf_fields(cfg) if not x[0].endswith(".type")]))
    cases = []
    for _ in range(n):
        name, pre, fields = rng.choice(pools)
        key, hint, value = rng.choice(fields)
        kind = base_kind(hint)
        what = rng.choice(["key", "type", "range", "syntax", "valid", "noequals"])
        if what == "key":
            cases.append((name, pre, f"{typo(key, rng)}={rng.choice(['1', 'x', '0.5'])}", False, None))
        elif what == "type":
            cases.append((name, pre, f"{key}={rng.choice(WRONG[kind])}", None, None))
        elif what == "range" and kind in (int, float):
            cases.append((name, pre, f"{key}={rng.choice(OUT_OF_RANGE)}", None, None))
        elif what == "syntax":
            cases.append((name, pre, f"{key}={rng.choice(MALFORMED)}", False, None))
        elif what == "noequals":
            cases.append((name, pre, rng.choice([key, f"={value}", f" {key}"]), False, None))
        else:
            shown = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            cases.append((name, pre, f"{key}={shown}", True, (key, value)))
    return cases


def lookup(doc, key):
    for part in key.split("."):
        doc = doc[part]
    return doc


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def test_config_show_fuzz(runner):
    cases = make_cases()
    kinds = {"fail": 0, "ok": 0}
    for name, pre, override, expect_ok, check in cases:
        r = runner.invoke(app, ["config", "show", str(CONFIGS / name), *pre, override])
        where = f"config show {name} {' '.join(pre)} {override!r}"
        assert not isinstance(r.exception, Exception) or isinstance(r.exception, SystemExit), (
            f"{where}: {type(r.exception).__name__}: {r.exception}")
        if r.exit_code == 0:
            assert expect_ok is not False, f"{where} was accepted"
            doc = yaml.safe_load(r.stdout)
            if check is not None:
                key, value = check
                assert lookup(doc, key) == value, where
            kinds["ok"] += 1
        else:
            assert expect_ok is not True, f"{where} failed: {r.output}"
            lines = r.output.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), f"{where}:\n{r.output}"
            assert "Traceback" not in r.output
            kinds["fail"] += 1
    # the mix exercised both outcomes (a generator bug would make everything pass or fail)
    assert kinds["fail"] > CASES // 2 and kinds["ok"] > CASES // 20, kinds


def test_named_bad_inputs_give_one_line(runner, tmp_path):
    """The inputs of issue 15 item 13, each with the message that names the fix."""
    job = str(CONFIGS / "maniskill_pushcube_ppo_mlp.yaml")
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here\n")
    cases = [
        ([job, "algorithm.gamma=1.5"], "algorithm.gamma must be in [0, 1]"),
        ([job, "trainer.num_minibatches=100000"], "set trainer.num_minibatches to at most 800"),
        ([str(empty)], "is empty"),
        ([job, "trainer.rollout_steps=0"], "trainer.rollout_steps to at least 1"),
        ([job, "trainer.lr=-1"], "trainer.lr must be a positive number"),
        ([job, "placement=diagonal"], "placement 'diagonal' not found"),
        ([job, "trainer.iterations=-1"], "trainer.iterations to at least 1"),
        ([job, "env.control_mode='"], "Cannot parse override"),
        ([job, "policy.hidden_sizes=[64, 64"], "close brackets"),
        ([job, "run.name=../../outside"], "run.name must be one directory name"),
        ([job, "algorithm.kl_coef=0.1"], "no reference policy"),
    ]
    for args, msg in cases:
        r = runner.invoke(app, ["config", "show", *args])
        assert r.exit_code == 2, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and msg in lines[0], (args, r.output)
