"""The config and rules loaders refuse nonsense when the config is loaded (before any job):
non-finite or mistyped numbers, out-of-range settings, keys with a trailing newline, binary
files, a folder where a file belongs. Each refusal is a ConfigError naming file and field;
generated configs (hypothesis) end in a RunConfig or a ConfigError, never anything else."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from safetyrepro.config import load_config
from safetyrepro.errors import ConfigError
from safetyrepro.rules import load_rules
from workflow_support import ROOT, TINY

BASE = yaml.safe_load(TINY.read_text())
BASE["envelope"]["rules"] = str(ROOT / "tests/configs/envelope_tiny.yaml")


def _write(tmp_path: Path, cfg: dict | str, name: str = "c.yaml") -> Path:
    p = tmp_path / name
    p.write_text(cfg if isinstance(cfg, str) else yaml.safe_dump(cfg, sort_keys=False))
    return p


def _with(section: str, key: str, value) -> dict:
    cfg = copy.deepcopy(BASE)
    cfg.setdefault(section, {})[key] = value
    return cfg


@pytest.mark.parametrize("section, key, text, needle", [
    ("runtime", "cell_timeout_s", ".inf", "inf is not a finite number"),
    ("runtime", "cell_timeout_s", ".nan", "nan is not a finite number"),
    ("runtime", "cell_timeout_s", "1.0e+9", "is greater than the maximum of 2592000"),
    ("runtime", "worker_idle_timeout_s", ".nan", "nan is not a finite number"),
    ("runtime", "device_wait_s", "-.inf", "-inf is not a finite number"),
    ("runtime", "prefill_store_mb", "2048.0", "2048.0 is not an integer"),
    ("analysis", "alpha", ".nan", "nan is not a finite number"),
    ("analysis", "bootstrap_seed", "-1", "-1 is less than the minimum of 0"),
    ("analysis", "bootstrap_samples", "1.0e+12", "is greater than the maximum of 1000000"),
    ("analysis", "subsample_fraction", ".inf", "inf is not a finite number"),
    ("analysis", "parse_clean_threshold", ".nan", "nan is not a finite number"),
    ("envelope", "seeds", "2.0", "2.0 is not an integer"),
    ("envelope", "seeds", "true", "True is not of type 'integer'"),
    ("generation", "batch_size", "16.0", "16.0 is not an integer"),
    ("data", "items_seed", "-5", "-5 is less than the minimum of 0"),
    ("runtime", "cell_timeout_s", "1e9", "write 1.0e+9"),
])
def test_bad_numbers_are_refused_naming_the_field(tmp_path, section, key, text, needle):
    cfg = _with(section, key, "@@")
    p = _write(tmp_path, yaml.safe_dump(cfg, sort_keys=False).replace("'@@'", text))
    with pytest.raises(ConfigError) as err:
        load_config(p)
    assert err.value.field == f"{section}.{key}" and str(p) in str(err.value)
    assert needle in str(err.value)


def test_a_key_with_a_trailing_newline_is_refused(tmp_path):
    cfg = copy.deepcopy(BASE)
    cfg["models"]["abc\n"] = cfg["models"].pop(next(iter(cfg["models"])))
    with pytest.raises(ConfigError, match="does not match"):
        load_config(_write(tmp_path, cfg))
    cfg = copy.deepcopy(BASE)
    cfg["run_name"] = "tiny\n"
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, cfg))
    assert err.value.field == "run_name"


def test_a_number_as_a_key_is_refused(tmp_path):
    text = yaml.safe_dump(BASE, sort_keys=False).replace("  truthfulqa:", "  1:", 1)
    with pytest.raises(ConfigError, match="key 1 is a int, not a name") as err:
        load_config(_write(tmp_path, text))
    assert err.value.field == "benchmarks"


def test_a_binary_config_is_refused(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8 text") as err:
        load_config(p)
    assert str(err.value).startswith(str(p))


def test_a_rules_path_that_is_a_folder(tmp_path):
    cfg = copy.deepcopy(BASE)
    cfg["envelope"]["rules"] = str(tmp_path)
    with pytest.raises(ConfigError, match=r"not a file \(a folder\?\)") as err:
        load_config(_write(tmp_path, cfg))
    assert str(err.value).startswith(str(tmp_path))
    with pytest.raises(ConfigError, match="not a file"):
        load_config(tmp_path)


def test_rules_numbers_are_checked_too(tmp_path):
    text = (ROOT / "tests/configs/envelope_tiny.yaml").read_text()
    p = _write(tmp_path, text.replace("seeds: {sampled: 2,", "seeds: {sampled: 2.0,"), "rules.yaml")
    with pytest.raises(ConfigError) as err:
        load_rules(p)
    assert err.value.field == "seeds.sampled" and "not an integer" in str(err.value)


def test_the_shipped_configs_still_load():
    for name in ("config.yaml", "paper.yaml"):
        assert load_config(ROOT / "config" / name).models
    assert load_config(TINY).models


# ---- generated configs ----------------------------------------------------------------------

NUMERIC = [("runtime", k) for k in ("cell_timeout_s", "worker_idle_timeout_s", "device_wait_s", "prefill_store_mb",
                                     "threads")] + \
          [("analysis", k) for k in ("alpha", "bootstrap_samples", "bootstrap_seed", "subsample_fraction",
                                      "subsample_repeats", "parse_clean_threshold")] + \
          [("generation", "batch_size"), ("envelope", "seeds"), ("data", "items_seed")]
VALUE = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70), st.booleans(),
                  st.text(max_size=5), st.none(), st.lists(st.integers(), max_size=2),
                  st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@pytest.mark.slow
@settings(derandomize=True, max_examples=800, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.sampled_from(NUMERIC), VALUE), min_size=1, max_size=4))
def test_fuzzed_settings_load_or_are_refused(tmp_path, changes):
    cfg = copy.deepcopy(BASE)
    for (section, key), value in changes:
        cfg.setdefault(section, {})[key] = value
    p = _write(tmp_path, cfg)
    t0 = time.perf_counter()
    try:
        rc = load_config(p)
    except ConfigError as exc:
        assert str(exc).startswith(str(p))
    else:   # what loaded is usable: every number finite and every count an int
        for (section, key), _ in changes:
            v = rc.data[section][key]
            assert isinstance(v, (int, float)) and not isinstance(v, bool) and v == v and abs(v) != float("inf")
    assert time.perf_counter() - t0 < 10   # bounded (generous: the test machine is shared)


@pytest.mark.slow
@settings(derandomize=True, max_examples=500, deadline=10000, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.text(max_size=200), st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
                      st.sampled_from(["[" * 1000, "a: &x [*x]", "!!python/object:os.system {}", "{1: 2}",
                                       "? [a]\n: 1\n", "run_name: !!binary aGk=\n", "---\n---\n"])))
def test_fuzzed_yaml_text_loads_or_is_refused(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        load_config(p)
    except ConfigError as exc:
        assert str(exc).startswith(str(p))
