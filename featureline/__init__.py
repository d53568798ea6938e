"""The launcher, on top of the stages: the ``featureline`` console script, the composition
of ``featureline.yaml`` from the stages' sections, and the end-to-end demo
(docs/ARCHITECTURE.md, "Layers").

In a checkout the stages' folders sit beside this one, and pyproject.toml maps each onto a
subpackage (``etl/`` is ``featureline.etl``). Imported from a checkout — by the editable
install, or by a process started in its root, where this folder comes first — the package's
path starts with the checkout's root, so every subpackage is read from its folder as it is
now (a module added since the install included). An installed wheel has no checkout around
it and is left as built.
"""

from pathlib import Path as _Path

_CHECKOUT = _Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file() and (_CHECKOUT / "etl" / "__init__.py").is_file():
    __path__.insert(0, str(_CHECKOUT))
