"""The documentation site builds with warnings as errors and covers every module, tutorial and example."""
import pathlib
import pkgutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ["pyro_sparsegp", "numpyro_sparsegp", "sparsegp_common"]

pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")
pytest.importorskip("furo")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Build the HTML site once (as CI does: ``-W --keep-going``) and return its folder."""
    out = tmp_path_factory.mktemp("docs") / "html"
    result = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                             str(ROOT / "docs"), str(out)], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-5000:]
    return out


@pytest.mark.slow
def test_api_pages_of_both_backends_document_svgp(site):
    for package in ["pyro_sparsegp", "numpyro_sparsegp"]:
        html = (site / "_generated" / "api" / f"{package}.svgp.html").read_text(encoding="utf-8")
        assert f'id="{package}.svgp.SVGP"' in html
        assert "whiten" in html and "Parameters" in html  # napoleon turned "Args:" into a field list


@pytest.mark.slow
def test_every_module_has_an_api_page(site):
    for package in PACKAGES:
        path = ROOT / package
        for module in [package] + [f"{package}.{m.name}" for m in pkgutil.iter_modules([str(path)])
                                   if not m.name.startswith("_")]:
            assert (site / "_generated" / "api" / f"{module}.html").is_file(), module


@pytest.mark.slow
def test_every_tutorial_and_example_has_a_page_with_its_code(site):
    scripts = {"tutorials": sorted((ROOT / "tutorials").glob("*.py")),
               "examples": sorted((ROOT / "docs" / "examples").glob("*.py"))}
    assert scripts["tutorials"] and scripts["examples"]
    for section, files in scripts.items():
        index = (site / "_generated" / section / "index.html").read_text(encoding="utf-8")
        for script in files:
            assert f'href="{script.stem}.html"' in index, script
            page = (site / "_generated" / section / f"{script.stem}.html").read_text(encoding="utf-8")
            assert 'class="highlight-python' in page, script  # the literalinclude of the code
