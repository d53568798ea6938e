"""Do the API, the online store and the embedding tables encode ids alike?

The API encodes raw ids with its ETL output's vocabularies; the online store holds the
encoded ids of the dataset last published into it (its publication stamp); each embedding
table declares the vocabulary version its rows are keyed by and the fit of the examples it
was trained on. Ids mean the same when one vocabulary extends the other (docs/ARCHITECTURE.md,
"Version stamps"); a table trained on another fit than the output's belongs to a model whose
other inputs the output no longer writes as it learned them ("Fits"). Anything else is a
problem that ``/readyz`` reports with a 503, naming what disagrees.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from featureline.api.models import Versions
from featureline.core.metadata import compatible

if TYPE_CHECKING:
    from featureline.api.services import Services


def check(services: Services) -> Versions:
    """Every part's version, and what disagrees with the API's vocabularies."""
    own = services.lineages
    problems = []
    publication = services.reader.publication()
    if publication is None:
        problems.append(f"online store: holds no published dataset (its Redis restarted "
                        f"empty, or nothing was published): run `featureline publish "
                        f"--repair` with the API's dataset {services.dataset_version}")
    else:
        for column, lineage in sorted(publication.vocabularies.items()):
            if column in own and not compatible(own[column], lineage):
                problems.append(
                    f"online store: {column} ids are from vocabulary {lineage[-1]} (dataset "
                    f"{publication.dataset_version}), not compatible with the API's "
                    f"{own[column][-1]} (dataset {services.dataset_version}); publish the "
                    "API's dataset or point the API at the published one")
    ranking = services.config.api.ranking
    embeddings = embedding_versions(services)
    fits = embedding_fits(services)
    for table, fit in sorted(fits.items()):
        if fit is not None and services.fit_version is not None and fit != services.fit_version:
            problems.append(
                f"embeddings {table}: trained on examples of fit {fit}; the API's dataset "
                f"{services.dataset_version} is of fit {services.fit_version}: train on it "
                "and reload the model")
    for feature, name in sorted(ranking.tables.items()):
        version = embeddings.get(f"{ranking.model}/{name}")
        encoded = services.vocabularies.column_of(feature)
        if version is not None and encoded in own and not compatible(own[encoded], [version]):
            problems.append(
                f"embeddings {ranking.model}/{name}: keyed by {encoded} vocabulary "
                f"{version}, not compatible with the API's {own[encoded][-1]}; export "
                "the tables from this lineage and reload the model")
    return Versions(dataset_version=services.dataset_version,
                    vocabularies={c: lineage[-1] for c, lineage in own.items()},
                    online_store=publication.to_json() if publication else None,
                    embeddings=embeddings, fit=services.fit_version, embedding_fits=fits,
                    problems=problems)


def embedding_versions(services: Services) -> dict[str, str | None]:
    """``model/table`` → the vocabulary version its rows are keyed by, for the ranking
    model's tables this process serves."""
    return {name: vocabulary for name, (vocabulary, _) in _table_stamps(services).items()}


def embedding_fits(services: Services) -> dict[str, str | None]:
    """``model/table`` → the fit of the examples it was trained on, for the ranking model's
    tables this process serves."""
    return {name: fit for name, (_, fit) in _table_stamps(services).items()}


def _table_stamps(services: Services) -> dict[str, tuple[str | None, str | None]]:
    """``model/table`` → its (vocabulary version, fit version), for the ranking model's
    tables this process serves."""
    ranking = services.config.api.ranking
    if services.hps is None or ranking.model not in services.hps.tables:
        return {}
    tables = services.hps.tables[ranking.model]
    return {f"{ranking.model}/{name}": (tables[name].config.vocabulary_version,
                                        tables[name].config.fit_version)
            for name in sorted(ranking.tables.values()) if name in tables}
