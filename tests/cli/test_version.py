"""One version: pyproject.toml's `project.version` is what `gpu-binder --version` prints (read
from the installed distribution's metadata), the Dockerfile's default for the image's
org.opencontainers.image.version label, and the chart's `version` and `appVersion`; the
changelog has a section for it. tests/e2e/test_image.py checks the built image's label and
`--version` inside the image."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import version as dist_version
from pathlib import Path

import pytest
import yaml

from cli.main import main, version

REPO = Path(__file__).resolve().parents[2]


def _pyproject_version() -> str:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def test_pyproject_version_is_semver():
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", _pyproject_version())


def test_cli_version_is_the_installed_distribution_and_pyproject(capsys):
    # the installed metadata is written at install time (make's venv stamp depends on
    # pyproject.toml, so a version bump re-installs)
    assert version() == dist_version("gpu-binder") == _pyproject_version()
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"gpu-binder {_pyproject_version()}\n"


def test_chart_version_and_app_version_are_pyproject():
    chart = yaml.safe_load((REPO / "charts/gpu-binder/Chart.yaml").read_text())
    assert chart["version"] == _pyproject_version()
    assert chart["appVersion"] == _pyproject_version()
    # quoted in the file, so YAML reads a string for any version (e.g. 1.10 stays "1.10")
    assert isinstance(chart["appVersion"], str)


def test_dockerfile_label_default_is_pyproject():
    text = (REPO / "Dockerfile").read_text()
    assert re.findall(r"^ARG VERSION=(\S+)$", text, re.M) == [_pyproject_version()]
    assert 'org.opencontainers.image.version="${VERSION}"' in text


def test_changelog_has_unreleased_and_the_version():
    text = (REPO / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.M)
    assert headings[0] == "Unreleased"
    assert _pyproject_version() in headings
    # each heading's link reference is defined at the bottom (Keep a Changelog)
    for h in headings:
        assert re.search(rf"^\[{re.escape(h)}\]: \S+", text, re.M), h
