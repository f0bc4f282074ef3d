"""Package data: files shipped inside the ``trainplan`` package (the wheel carries them; pyproject's
``package-data``), found with :mod:`importlib.resources`, never relative to a repository checkout.

| name | what | in a checkout |
|---|---|---|
| ``config.schema.yaml`` | the study config's JSON Schema (YAML) | the file itself |
| ``default_config.yaml`` | the embedded default study | symlink to ``config/config.yaml`` (the user-facing file) |
| ``templates/memo.html.j2``, ``templates/memo.css`` | the memo's template and stylesheet | symlinks to ``report/templates/`` |
| ``templates/*.sh.j2`` | launch script templates | the files themselves |
| ``trainplan.mplstyle`` | the figures' matplotlib style | the file itself |
| ``data/*.csv``, ``data/efficiency_fits.json`` | published tables, fitted efficiencies | the files themselves |

The symlinks keep one file per resource (no copy that can drift) while the study's users keep editing
``config/`` and ``report/``; building the wheel copies the linked content in. This module imports only the
standard library.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SCHEMA = "config.schema.yaml"
DEFAULT_CONFIG = "default_config.yaml"
MEMO_TEMPLATE = "templates/memo.html.j2"
MEMO_CSS = "templates/memo.css"
MPL_STYLE = "trainplan.mplstyle"
DATA = "data"


def path(name: str) -> Path:
    """The filesystem path of package data file ``name`` (``/``-separated, relative to the package).
    trainplan is installed as files (wheel or editable install), never zipped, so it has a real path."""
    return Path(str(resources.files("trainplan").joinpath(*name.split("/"))))
