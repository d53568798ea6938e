"""MkDocs hooks: the pages made at build time (docs/ARCHITECTURE.md, "The user guide") —
the README as the home page, benchmarks/README.md as the benchmarks page, and the
configuration and API references generated from the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from featureline.docs import api_reference, configuration_reference, site_markdown


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    root = Path(config.config_file_path).parent
    pages = {
        "index.md": site_markdown((root / "README.md").read_text()),
        "benchmarks.md": site_markdown((root / "benchmarks" / "README.md").read_text()),
        "reference/configuration.md": configuration_reference(),
        "reference/api.md": api_reference(),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """A guide page's links to the repository's files (read on GitHub) as the site's pages."""
    if page.file.generated_by is not None:
        return markdown
    return site_markdown(markdown, "docs")
