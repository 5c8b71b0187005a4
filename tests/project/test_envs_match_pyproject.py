"""envs/safetyrepro.yaml (the software the rules declare for Snakemake's linter) lists every
runtime dependency of pyproject.toml and its harness extra, with the same version bounds."""
import re
import tomllib

import yaml


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _bounds(spec: str) -> str:
    return spec.strip()[len(re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0]):].replace(" ", "")


def test_conda_env_covers_pyproject(project_root):
    project = tomllib.loads((project_root / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["harness"]
    env = yaml.safe_load((project_root / "envs/safetyrepro.yaml").read_text())["dependencies"]
    specs = {}
    for d in env:
        for x in d["pip"] if isinstance(d, dict) else [d]:
            specs[_name(x)] = _bounds(x)
    specs["torch"] = specs.get("pytorch")
    for d in deps:
        assert _name(d) in specs, f"envs/safetyrepro.yaml lacks {_name(d)}"
        assert specs[_name(d)] == _bounds(d), f"envs/safetyrepro.yaml: {_name(d)} {specs[_name(d)]} != {d}"
