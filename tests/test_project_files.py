"""The project's metadata files agree with pyproject.toml (issue 41, item 4): the
license is Apache-2.0 as an SPDX expression with its text in LICENSE, and
CITATION.cff cites this version under that license."""

import os
import tomllib

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject() -> dict:
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)["project"]


def test_the_license_is_an_spdx_expression_with_its_text():
  project = _pyproject()
  assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
  text = open(os.path.join(ROOT, "LICENSE")).read()
  assert "Apache License" in text and "Version 2.0, January 2004" in text
  assert "END OF TERMS AND CONDITIONS" in text


def test_the_citation_cites_this_version_under_its_license():
  project = _pyproject()
  cff = yaml.safe_load(open(os.path.join(ROOT, "CITATION.cff")))
  assert cff["cff-version"] == "1.2.0" and cff["type"] == "software"
  assert str(cff["version"]) == project["version"]
  assert cff["license"] == project["license"]
  assert cff["title"].startswith(project["name"]) and cff["authors"]
  assert os.path.exists(os.path.join(ROOT, "CHANGELOG.md"))
