"""envs/safetyrepro.yaml must list every runtime dependency of pyproject.toml."""
import re
import tomllib

import yaml


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_conda_env_covers_pyproject(project_root):
    deps = tomllib.loads((project_root / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((project_root / "envs/safetyrepro.yaml").read_text())["dependencies"]
    names = set()
    for d in env:
        if isinstance(d, dict):
            names |= {_name(x) for x in d["pip"]}
        else:
            names.add(_name(d))
    names.add("torch") if "pytorch" in names else None
    missing = {_name(d) for d in deps} - names
    assert not missing, f"envs/safetyrepro.yaml lacks {sorted(missing)}"
