"""The no-downgrade check of the newest-versions tier (``.ci/newest``).

    python .ci/versions.py record FILE   # the versions a user's environment holds
    python .ci/versions.py check FILE    # after installing sparsegp: the same, and newer than CI's pins
    python .ci/versions.py show          # the versions the tier tested
"""
import json
import pathlib
import sys
from importlib import metadata

KEPT = ("jax", "jaxlib", "numpyro", "numpy", "arviz", "arviz-base", "arviz-stats", "xarray")
NEWER_THAN_PINS = ("jax", "arviz")  # the case: a newer JAX and ArviZ 1.x than constraints.txt


def installed():
    found = {}
    for name in KEPT:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return found


def pins():
    lines = (pathlib.Path(__file__).parent.parent / "constraints.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if "==" in line and not line.startswith("#"))


def release(version):
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def main(command, path=None):
    now = installed()
    if command == "record":
        pathlib.Path(path).write_text(json.dumps(now))
        return 0
    if command == "show":
        print("newest-versions tier: " + ", ".join(f"{k} {v}" for k, v in now.items()))
        return 0
    before = json.loads(pathlib.Path(path).read_text())
    changed = {k: (v, now.get(k)) for k, v in before.items() if now.get(k) != v}
    if changed:
        print(f"installing sparsegp replaced the environment's versions: {changed}")
        return 1
    stale = [k for k in NEWER_THAN_PINS if release(now[k]) <= release(pins()[k])]
    if stale:
        print(f"the index offers no newer {stale} than constraints.txt: the check would prove nothing")
        return 1
    print("kept: " + ", ".join(f"{k} {v}" for k, v in now.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
