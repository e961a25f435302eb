"""Only the package list lives here (everything else is in pyproject.toml): every package under dynheads_tl is
found, so a new claim folder ships without being listed, plus the notebooks, which live in notebooks/ and ship
as dynheads_tl.notebooks (mapped in pyproject.toml's [tool.setuptools.package-dir]), and the report's template
directory, a folder of data files that setuptools ships as a package of its own (its files are package data)."""
from setuptools import find_packages, setup

setup(packages=find_packages(include=["dynheads_tl", "dynheads_tl.*"])
      + ["dynheads_tl.notebooks", "dynheads_tl.report.templates.dynheads_site",
         "dynheads_tl.report.templates.markdown"])
