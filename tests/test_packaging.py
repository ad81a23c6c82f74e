"""The package metadata states ranges, constraints.txt the exact versions CI tests, and the two agree."""
import pathlib
import tomllib

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parents[1]


def requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        found += [Requirement(r) for r in extra]
    return [r for r in found if r.name != project["name"]]


def pins():
    lines = [line.split("#")[0].strip() for line in (ROOT / "constraints.txt").read_text().splitlines()]
    pinned = {}
    for line in filter(None, lines):
        name, _, version = line.partition("==")
        assert version, f"constraints.txt holds exact versions only, got {line!r}"
        pinned[Requirement(name).name.lower().replace("_", "-")] = Version(version)
    return pinned


@pytest.mark.parametrize("requirement", requirements(), ids=str)
def test_each_requirement_is_a_range_that_holds_its_pinned_version(requirement):
    assert not any(s.operator == "==" for s in requirement.specifier), "the metadata states ranges, not pins"
    assert any(s.operator == ">=" for s in requirement.specifier), "each dependency states the lower bound it is tested with"
    version = pins().get(requirement.name.lower().replace("_", "-"))
    assert version is not None, f"{requirement.name} is not pinned in constraints.txt"
    assert requirement.specifier.contains(version), f"constraints.txt pins {version}, outside {requirement}"


def test_the_readme_commands_install_with_the_constraints():
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if "pip install" in line and line.startswith("python3 -m venv")]
    assert len(commands) == 2 and all("-c constraints.txt" in line for line in commands)
